"""The `hetrl` command.

    hetrl train ALGO --env ID [--steps N] [--seed S] [--out DIR] [--set key=value ...] [--config FILE.yaml]
    hetrl train [ALGO] --env ID --hyperparams rl-zoo/hyperparams/ALGO.yml     (an rl-baselines3-zoo file)
    hetrl train --resume DIR [--steps N] [--schedule S] [--actors N] [--address A] [--set device=...]
    hetrl eval DIR [--episodes N] [--render video|rgb_array]
    hetrl settings ALGO --env ID          (the effective settings: defaults < preset < file < --set)
    hetrl algorithms                      (the registered algorithms: built-in, registered, entry points)
    hetrl tabular ALGO --env ID ...       (parallel tabular Q-learning / SARSA)

Bad input prints one line `error: <problem>; <fix>` and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hetrl.errors import NonFiniteError, UsageError


def _add_train(sub) -> None:
    p = sub.add_parser("train", help="train an agent (profiles and plans first unless --plan none)",
                       description="Train ALGO on an env with its preset hyperparameters.")
    p.add_argument("algo", nargs="?", help="a registered algorithm (`hetrl algorithms`): dqn, ddpg, td3, sac, ...")
    p.add_argument("--env", help="Gymnasium id, e.g. CartPole-v1 or module:EnvId")
    p.add_argument("--steps", type=int, help="total env steps (default: the preset's)")
    p.add_argument("--seed", type=int, default=None, help="default 0")
    p.add_argument("--out", help="run directory (default runs/ALGO-ENV-sSEED)")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", default=[],
                   help="override a setting (repeatable); see `hetrl settings`")
    p.add_argument("--config", help="YAML file of settings")
    p.add_argument("--hyperparams", metavar="FILE.yml",
                   help="an rl-baselines3-zoo hyperparameter file (its entry for --env; ALGO defaults to the file's "
                        "name); --config and --set win over it")
    p.add_argument("--force", action="store_true", help="overwrite an existing run directory")
    p.add_argument("--resume", metavar="DIR", help="continue the run saved in DIR")
    p.add_argument("--save-replay", action="store_true", help="also save the replay (exact --resume)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plan", choices=["auto", "none"], default=None,
                   help="auto (default for a new run): profile once, then let the planner place the parts and "
                        "choose the actor count around what you set by hand; none (default with --resume): run "
                        "the settings as given")
    p.add_argument("--objective", choices=["throughput", "efficiency"], default="throughput",
                   help="what --plan auto optimises: env steps/s, or env steps per joule, at the preset's settings")
    p.add_argument("--allow-more-envs", action="store_true",
                   help="let --plan auto change the preset's num_envs for throughput (the learning dynamics change)")
    p.add_argument("--seeds", metavar="N|S1,S2,...",
                   help="train a population: N members (seeds 0..N-1) or these seeds, as one run (docs/population.md)")
    p.add_argument("--sweep", action="append", metavar="KEY=V1,V2,...", default=[],
                   help="a population over these values of a setting (repeatable: the grid x the seeds)")
    # schedules (hetrl/runtime/): shorthands for --set schedule=/actors=/envs_per_actor=/ray_address=
    p.add_argument("--schedule", choices=["inline", "local", "ray"],
                   help="inline: one process; local: actor processes + learner (docs/local.md); "
                        "ray: actors and a replay server on a Ray cluster (docs/ray.md)")
    p.add_argument("--actors", type=int, metavar="N",
                   help="actors (local: processes, default cores - 1; ray: Ray actors, default CPUs - 1)")
    p.add_argument("--envs-per-actor", type=int, metavar="M",
                   help="envs stepped by each actor (local and ray schedules; default: num_envs / actors)")
    p.add_argument("--address", metavar="auto|HOST:PORT",
                   help="ray schedule: the Ray cluster to join (`ray start --head` prints it); "
                        "default: start a local Ray")
    p.set_defaults(func=cmd_train)


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a saved run")
    p.add_argument("dir", help="run directory with checkpoint.pt")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--render", choices=["video", "rgb_array"],
                   help="video: write MP4s to DIR/videos (needs moviepy); rgb_array: frames to DIR/frames.npz")
    p.set_defaults(func=cmd_eval)


def _add_algorithms(sub) -> None:
    p = sub.add_parser("algorithms", help="list the algorithms hetrl can train (built-in and registered)")
    p.set_defaults(func=cmd_algorithms)


def _add_settings(sub) -> None:
    p = sub.add_parser("settings", help="print the effective settings for ALGO on an env")
    p.add_argument("algo", help="a registered algorithm (`hetrl algorithms`)")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--set", dest="sets", action="append", metavar="KEY=VALUE", default=[])
    p.add_argument("--config")
    p.set_defaults(func=cmd_settings)


def _add_warm(sub) -> None:
    p = sub.add_parser("warm", help="compile the CPU learner kernel into numba's cache now (make install does), "
                                    "so that no run waits for it")
    p.add_argument("parts", nargs="*", metavar="PART",
                   help="only these (ddpg, td3, dqn, sac, crossq: their loss heads; derived: the phase any other "
                        "algorithm runs), one process each; default: all, in three processes")
    p.set_defaults(func=cmd_warm)


def cmd_warm(args) -> int:
    from hetrl.kernels.compiled.warm import GROUPS, warm

    known = [n for g in GROUPS for n in g]
    bad = [n for n in args.parts if n not in known]
    if bad:
        raise UsageError(f"hetrl warm: no compiled part named {', '.join(bad)}; name some of {', '.join(known)}, "
                         "or none for all")
    groups = [(n,) for n in dict.fromkeys(args.parts)] or GROUPS
    return 1 if warm(groups, say=lambda msg: print(msg, file=sys.stderr)) else 0


def build_parser() -> argparse.ArgumentParser:
    import hetrl

    parser = argparse.ArgumentParser(prog="hetrl", description=__doc__.split("\n\n")[0].strip() if __doc__ else "")
    parser.add_argument("--version", action="version", version=f"hetrl {hetrl.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_train(sub)
    _add_eval(sub)
    _add_settings(sub)
    _add_algorithms(sub)
    _add_warm(sub)
    from hetrl.planner.cli import register as register_planner
    from hetrl.tabular.cli import register as register_tabular
    from hetrl.report.cli import register as register_report

    register_planner(sub)
    register_tabular(sub)
    register_report(sub)
    return parser


def _checked_sets(args, algo: str | None = None) -> dict:
    """The --set pairs, every value checked against ALGO's settings (also where a dedicated flag overrides the
    same key); a dedicated flag (--steps, --seed) that contradicts a --set of the same key is an error naming both."""
    from hetrl.config import Config, check_value, parse_sets, settings_class

    cls = settings_class(algo) if algo else Config
    sets = parse_sets(args.sets)
    for key, value in sets.items():
        check_value(key, value, cls)
    flags = {"steps": getattr(args, "steps", None), "seed": getattr(args, "seed", None)}
    for key, flag in flags.items():
        if flag is not None and key in sets and check_value(key, sets[key], cls) != flag:
            raise UsageError(f"--{key} {flag} and --set {key}={sets[key]} disagree; give one of them")
    return sets


def _overrides(args) -> dict:
    """--config < --set (see _checked_sets)."""
    from hetrl.config import read_config_file

    over = read_config_file(args.config) if args.config else {}
    over.update(_checked_sets(args, args.algo))
    return over


def cmd_settings(args) -> int:
    from hetrl.config import make_config

    cfg = make_config(args.algo, args.env, _overrides(args))
    for k, v in cfg.to_dict().items():
        print(f"{k:<26} {v}")
    return 0


def cmd_algorithms(args) -> int:
    from hetrl import registry

    for name in registry.names():
        try:
            cls = registry.get(name)
            spaces = "/".join("discrete" if k.__name__ == "Discrete" else "continuous" if k.__name__ == "Box"
                              else k.__name__ for k in cls.action_spaces)
            doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
            print(f"{name:<12} {spaces:<20} {registry.origin(name):<28} {doc}")
        except UsageError as e:   # a broken entry point is listed with its problem, the rest still are
            print(f"{name:<12} {'?':<20} {'error':<28} {e}")
    return 0


def cmd_train(args) -> int:
    from hetrl import api

    progress = not args.no_progress
    if args.resume:
        if args.algo or args.env or args.config or args.hyperparams:
            raise UsageError("--resume takes the algorithm's settings saved in the run; drop ALGO/--env/--config/--hyperparams "
                             "(--steps, --schedule, --actors, --envs-per-actor, --address, --plan and system "
                             "settings such as --set device=cuda may change)")
        from hetrl.config import check_value

        sets = _checked_sets(args)
        steps = check_value("steps", sets.pop("steps")) if "steps" in sets else args.steps  # may change on resume
        run = api.resume(args.resume, steps=steps, progress=progress, plan=args.plan or "none",
                         objective=args.objective, **{**sets, **_schedule_flags(args)})
        _summary(run.result, Path(args.resume))
        return _exit_code(run)
    if args.hyperparams and not args.algo:
        from hetrl.sb3 import zoo

        args.algo = zoo.algo_of(args.hyperparams)
    if not args.algo or not args.env:
        raise UsageError("train needs ALGO and --env, e.g. `hetrl train dqn --env CartPole-v1`")
    sets = _checked_sets(args, args.algo)
    population = {"seeds": args.seeds, "sweep": args.sweep} if args.seeds is not None or args.sweep else {}
    run = api.train(args.algo, env=args.env, steps=args.steps, seed=args.seed, out=args.out or True, force=args.force,
                    config=args.config, save_replay=args.save_replay, progress=progress, plan=args.plan or "auto",
                    objective=args.objective, allow_more_envs=args.allow_more_envs, hyperparams=args.hyperparams,
                    **population,
                    **{**sets, **_schedule_flags(args)})
    if run.interrupted and run.interrupted != "callback":
        print(f"hetrl: interrupted ({run.interrupted}) at {run.result['env_steps']:,} env steps; checkpoint saved "
              f"in {run.out} (continue with `hetrl train --resume {run.out}`)", file=sys.stderr)
        return _exit_code(run)
    _summary(run.result, run.out)
    return 0


def _exit_code(run) -> int:
    """0, or the shell's code for the signal that stopped the run (128 + 2 SIGINT, 128 + 15 SIGTERM)."""
    return {"SIGINT": 130, "SIGTERM": 143}.get(run.interrupted, 0) if run.interrupted else 0


def _schedule_flags(args) -> dict:
    """--schedule/--actors/--envs-per-actor/--address as settings (they win over --set and --config)."""
    flags = {"schedule": args.schedule, "actors": args.actors, "envs_per_actor": args.envs_per_actor,
             "ray_address": args.address}
    if args.address is not None and (args.schedule or "ray") != "ray":
        raise UsageError(f"--address joins a Ray cluster, which only --schedule ray uses (got --schedule {args.schedule})")
    if args.address is not None:
        flags["schedule"] = "ray"
    return {k: v for k, v in flags.items() if v is not None}


def _plan_line(plan: dict) -> str:
    """One line on what the planner set and what it kept (result.json's `plan`)."""
    changed = plan.get("changed_learning_settings") or {}
    if changed:
        what = ", ".join(f"{k} {new} (the preset's {old})" for k, (old, new) in changed.items())
        return (f"the learning dynamics changed: --allow-more-envs let the planner set {what}; this run does "
                "not learn as the preset does")
    chosen = " ".join(f"{k}={v}" for k, v in (plan.get("chosen") or {}).items())
    return (f"the planner set {chosen or 'nothing'}; every learning setting is the preset's "
            f"(num_envs {plan.get('owned_by_preset', {}).get('num_envs', '?')})")


def _summary(result: dict, out: Path) -> None:
    if "population" in result:
        _population_summary(result, out)
        return
    if isinstance(result.get("plan"), dict):
        print(f"hetrl: {_plan_line(result['plan'])}", file=sys.stderr)
    measured = result.get("env_steps_per_s_learning")
    if result.get("predicted_env_steps_per_s") and measured:
        err = measured / result["predicted_env_steps_per_s"] - 1
        print(f"hetrl: measured {measured:,.0f} env steps/s while learning vs predicted "
              f"{result['predicted_env_steps_per_s']:,.0f} ({err:+.0%}); "
              f"{result['env_steps_per_s']:,.0f} over the whole run (warm-up included)", file=sys.stderr)
    if (result.get("plan_follow") or {}).get("short"):   # the run fell short of its plan: what it tried (follow.py)
        print(f"hetrl: {result['plan_follow']['why']}", file=sys.stderr)
    keys = ["env_steps", "gradient_steps", "wall_s", "env_steps_per_s", "env_steps_per_s_learning", "train_samples_per_s",
            "eval_return_mean", "eval_return_std", "policy", "best_env_steps", "final_eval_return_mean",
            "predicted_env_steps_per_s", "threads",
            # local and ray schedule figures (absent under inline)
            "actors", "envs_per_actor", "replay_ratio_achieved", "policy_staleness_mean",
            "actor_busy_fraction", "learner_busy_fraction", "actor_restarts", "ray_nodes"]
    fig = {k: result[k] for k in keys if k in result}
    print(json.dumps(fig, indent=None, default=lambda v: round(v, 2)))
    if result.get("eval_episodes_cut"):
        print(f"hetrl: {result['eval_episodes_cut']} of {result.get('eval_episodes', '?')} evaluation episodes did not end "
              "and were cut at the step limit (the env's time limit, else 10,000; --set eval_max_steps=N)",
              file=sys.stderr)
    print(f"hetrl: saved {out}/result.json and {out}/checkpoint.pt", file=sys.stderr)


def _population_summary(result: dict, out: Path) -> None:
    """The population's figures and its report table (hetrl report OUT prints it again)."""
    from hetrl.report.cli import render
    from hetrl.report.runs import load_population
    from hetrl.report.summary import row

    keys = ["members", "env_steps", "wall_s", "env_steps_per_s", "lanes", "groups", "learner_kernel"]
    print(json.dumps({k: result[k] for k in keys if k in result}, default=lambda v: round(v, 2)))
    if result.get("aggregate"):
        render([row(g, "best", curve=False) for g in load_population(out)], "best", file=sys.stderr)
    print(f"hetrl: saved {out}/result.json, {out}/curves.png and every member in {out}/members/", file=sys.stderr)


def cmd_eval(args) -> int:
    import numpy as np

    from hetrl import api
    from hetrl.runtime.population import is_population

    if args.episodes <= 0:
        raise UsageError(f"--episodes must be positive, got {args.episodes}")
    if is_population(args.dir):   # every member's policy
        if args.render:
            raise UsageError("--render takes one run; give a member's directory (DIR/members/NAME)")
        out = {name: {k: v for k, v in policy.evaluate(args.episodes, seed=args.seed).items() if k != "eval_returns"}
               for name, policy in api.load(args.dir).items()}
        print(json.dumps(out, default=lambda v: round(v, 3)))
        return 0
    policy = api.load(args.dir)
    video_dir = None
    if args.render == "video":
        try:
            import moviepy  # noqa: F401
        except ImportError:
            raise UsageError("--render video needs moviepy; pip install 'hetrl[video]' or moviepy") from None
        video_dir = str(Path(args.dir) / "videos")
    result = policy.evaluate(args.episodes, seed=args.seed, video_dir=video_dir)
    if args.render == "rgb_array":
        from hetrl.actors.envs import make_env

        env = make_env(policy.eval_env, render_mode="rgb_array")
        obs, _ = env.reset(seed=policy.cfg.seed + 10_000)
        frames, done = [env.render()], False
        while not done:
            obs, _, term, trunc, _ = env.step(policy.act(obs))
            frames.append(env.render())
            done = term or trunc
        env.close()
        np.savez_compressed(Path(args.dir) / "frames.npz", frames=np.stack(frames))
        result["frames"] = str(Path(args.dir) / "frames.npz")
    if video_dir:
        result["videos"] = video_dir
    result.pop("eval_returns", None)
    print(json.dumps(result, default=lambda v: round(v, 3)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NonFiniteError as e:  # the data or the loss, not hetrl: one line, what and where
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hetrl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
