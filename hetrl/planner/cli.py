"""`hetrl profile` and `hetrl plan` (wired into hetrl/cli.py through :func:`register`).

    hetrl profile [ALGO --env ID] [--set key=value ...] [--refresh] [--quick] [--json]
    hetrl plan ALGO --env ID [--objective throughput|efficiency] [--set key=value ...]
               [--pin key=value ...] [--cores N|auto] [--all-placements] [--allow-more-envs] [--top K]
               [--refresh] [--quick] [--json]
"""

from __future__ import annotations

import json
import sys


def _progress(quiet: bool = False):
    """Profiling progress on stderr (stdout stays one JSON object with --json)."""
    if quiet:
        return None

    def say(msg: str) -> None:
        print(f"hetrl profile: {msg}", file=sys.stderr, flush=True)
    return say


def _config(args):
    from hetrl import registry
    from hetrl.actors.envs import prepare_env, probe_spaces
    from hetrl.config import make_config, parse_sets

    cfg = make_config(args.algo, args.env, parse_sets(args.sets))
    registry.get(cfg.algo).check_spaces(*probe_spaces(prepare_env(cfg.env, cfg)))
    return cfg


def cmd_profile(args) -> int:
    from hetrl.planner.explain import render_profile
    from hetrl.planner.profile import load_or_profile

    cfg = _config(args)
    table = load_or_profile(cfg, refresh=args.refresh, quick=args.quick, progress=_progress())
    if args.json:
        print(json.dumps({**table.to_json(), "path": str(table.path), "from_cache": table.from_cache}))
    else:
        render_profile(table)
    return 0


def cmd_plan(args) -> int:
    from hetrl.errors import UsageError
    from hetrl.planner import plan
    from hetrl.planner.explain import render_plan

    if not args.algo or not args.env:
        raise UsageError("plan needs ALGO and --env, e.g. `hetrl plan dqn --env CartPole-v1`")
    cores = args.cores
    if cores is not None and cores != "auto":
        try:
            cores = float(cores)
        except ValueError:
            raise UsageError(f"--cores {args.cores!r} is not a number; give e.g. --cores 4, --cores 1.5 or "
                             "--cores auto") from None
        if cores <= 0:
            raise UsageError(f"--cores must be > 0, got {args.cores}")
    cfg = _config(args)
    from hetrl.config import parse_sets

    more = args.allow_more_envs
    if more and "num_envs" in parse_sets(args.sets):   # a num_envs set by hand is kept
        print(f"hetrl plan: num_envs={cfg.num_envs} was set by hand: kept (--allow-more-envs ignored)", file=sys.stderr)
        more = False
    # the system settings given with --set are pins, as `hetrl train` takes them; an explicit --pin wins
    from hetrl.planner.search import parse_pins, pins_from_settings

    pins = {**pins_from_settings(parse_sets(args.sets)), **parse_pins(args.pins)}
    result = plan(cfg, objective=args.objective, pins=pins, cores=cores,
                  placement="all" if args.all_placements else "runnable", refresh=args.refresh,
                  quick=args.quick, progress=_progress(), top=args.top, allow_more_envs=more)
    pop = _population_plan(args, cfg, result) if args.seeds is not None or args.sweep else None
    if args.json:
        print(json.dumps({**result.to_json(), **({"population": pop.to_json()} if pop else {})}))
    else:
        render_plan(result)
        if pop:
            print(f"population: {pop.describe()}")
    return 0


def _population_plan(args, cfg, result):
    """How a population of cfg's algorithm is grouped: its members, the kernel the profile chose, the cores."""
    import os

    from hetrl.kernels import Choice, kernel_class
    from hetrl.planner.population import plan_population
    from hetrl.runtime.population import parse_seeds, parse_sweep

    seeds, sweep = parse_seeds(args.seeds if args.seeds is not None else 1), parse_sweep(args.sweep)
    members = len(seeds)
    for values in sweep.values():
        members *= len(values)
    device = result.plan.learner_device
    choice = Choice.from_json(result.kernel) if result.kernel else Choice()
    return plan_population(members, result.cores or os.cpu_count() or 1, choice.name,
                           kernel_class(choice.name).side_by_side(), device=device)


def register(subparsers) -> None:
    from hetrl.planner.search import OBJECTIVES, PLAN_FIELDS

    p = subparsers.add_parser("profile", help="measure this machine's primitives for an algo/env, cache the table",
                              description="Time env steps, inference, learner updates, replay insert/sample/update "
                                          "and transfers on every device present; cache the table per machine.")
    p.add_argument("algo", nargs="?", default="dqn", help="a registered algorithm (`hetrl algorithms`; default dqn)")
    p.add_argument("--env", default="CartPole-v1", help="Gymnasium id (default CartPole-v1)")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", default=[],
                   help="override a setting (net_arch, batch_size, ...) as for train")
    p.add_argument("--refresh", action="store_true", help="measure again even if a cached table exists")
    p.add_argument("--quick", action="store_true", help="a tiny grid (seconds; for smoke tests)")
    p.add_argument("--json", action="store_true", help="print the table as one JSON object")
    p.set_defaults(func=cmd_profile)

    q = subparsers.add_parser("plan", help="show the best placement for ALGO on an env, with predicted figures",
                              description="Pick the plan (schedule, actors, envs per actor, devices, threads) "
                                          "with the best predicted throughput or efficiency; see docs/planner.md.")
    q.add_argument("algo", nargs="?", help="a registered algorithm (`hetrl algorithms`)")
    q.add_argument("--env", help="Gymnasium id, e.g. CartPole-v1")
    q.add_argument("--objective", choices=OBJECTIVES, default="throughput",
                   help="throughput: env steps/s at the preset's settings (replay ratio, envs); efficiency: env "
                        "steps per joule")
    q.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", default=[],
                   help="override a setting as for train (e.g. --set prioritized=true); system settings "
                        "(schedule, actors, envs_per_actor, threads, device) pin the plan as they do for train")
    q.add_argument("--pin", dest="pins", action="append", metavar="KEY=VALUE", default=[],
                   help=f"fix a plan field and search the rest ({', '.join(PLAN_FIELDS)}, or device); the "
                        "preset's settings (batch_size, num_envs, ...) change with --set")
    q.add_argument("--cores", metavar="N|auto",
                   help="plan for N CPU cores (default: this machine's; a fraction is fine); auto: the cores "
                        "this machine gives us now (a 0.4 s probe; for machines shared with other programs)")
    q.add_argument("--all-placements", action="store_true",
                   help="also price placements this runtime cannot run (data storage apart from the learner, "
                        "replay manager or actor inference on a GPU): modelled, not runnable")
    q.add_argument("--allow-more-envs", action="store_true",
                   help="let the planner change the preset's num_envs for throughput (the learning dynamics change)")
    q.add_argument("--top", type=int, default=5, help="runners-up to show (default 5)")
    q.add_argument("--refresh", action="store_true", help="re-profile first")
    q.add_argument("--quick", action="store_true", help="if no profile is cached, measure a tiny grid (smoke tests)")
    q.add_argument("--json", action="store_true", help="print the result as one JSON object (docs/planner.md)")
    q.add_argument("--seeds", metavar="N|S1,S2,...", help="plan a population: how its members are grouped into "
                                                          "processes and lanes (docs/population.md)")
    q.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...", default=[],
                   help="a population over these values of a setting, as for train")
    q.set_defaults(func=cmd_plan)
