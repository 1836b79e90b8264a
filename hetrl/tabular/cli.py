"""`hetrl tabular ALGO --env ID ...`: parallel tabular Q-learning / SARSA from the command line.

`register(subparsers)` adds the subcommand to hetrl's parser; `main(argv)` runs it on its own
(``python -m hetrl.tabular.cli qlearning --env Taxi-v3``), printing ``error: <msg>`` and
returning 2 on a UsageError like the hetrl CLI does.
"""

from __future__ import annotations

import argparse
import json
import sys

from hetrl.errors import UsageError

EPILOG = """examples:
  hetrl tabular qlearning --env Taxi-v3 --workers 2 --transitions 1M --dtype int32 --out runs/taxi
  hetrl tabular sarsa --env CliffWalking-v0 --workers 2 --rounds 10 --out runs/cliff
  hetrl tabular qlearning --env FrozenLake-v1 --mode online --workers 2 --transitions 2M
  hetrl tabular qlearning --env Taxi-v3 --transitions 1M --save-data taxi1m.npz   # then --data taxi1m.npz
"""


def count(text: str) -> int:
    """'1000000', '1_000_000', '1e6', '1M', '250k' -> int (argparse type)."""
    t = str(text).strip().replace("_", "")
    mult = 1
    if t[-1:].lower() in ("k", "m", "g"):
        mult = {"k": 10**3, "m": 10**6, "g": 10**9}[t[-1].lower()]
        t = t[:-1]
    try:
        v = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; e.g. 1000000, 1e6 or 1M") from None
    if v != int(v):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return int(v)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from hetrl.tabular.options import ALGOS, BACKENDS, BEHAVIOURS, DTYPES, MERGES, MODES, SARSA_NEXT

    p.add_argument("algo", choices=ALGOS, help="update rule")
    p.add_argument("--env", required=True, help="Gymnasium id with Discrete spaces (FrozenLake-v1, Taxi-v3, CliffWalking-v0, ...)")
    p.add_argument("--workers", "-w", type=int, default=1, help="parallel workers (threads running compiled kernels); default 1")
    p.add_argument("--transitions", "-n", type=count, default=1_000_000,
                   help="offline: dataset size N; online: total env steps (default 1M; accepts 1e6, 1M)")
    p.add_argument("--rounds", "-r", type=int, default=None,
                   help="merges; offline: passes over the data (default 10); online default 50")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="Q-table precision; int32 = SwiftRL fixed point")
    p.add_argument("--mode", choices=MODES, default="offline", help="offline dataset (default) or online env interaction")
    p.add_argument("--out", default=None, help="directory for q_table.npy and result.json")
    p.add_argument("--force", action="store_true", help="overwrite an existing DIR/result.json")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("learning")
    g.add_argument("--alpha", type=float, default=None, help="learning rate of round 1 (default 0.5)")
    g.add_argument("--alpha-final", type=float, default=None, help="learning rate of the last round (default alpha/10; geometric decay)")
    g.add_argument("--gamma", type=float, default=None, help="discount (default 0.99)")
    g.add_argument("--epsilon", type=float, default=None,
                   help="exploration of round 1: learner-side SARSA offline (default 0.3), behaviour online (default 1.0)")
    g.add_argument("--epsilon-final", type=float, default=None, help="exploration of the last round (default 0; linear decay)")
    g.add_argument("--sarsa-next", choices=SARSA_NEXT, default="policy",
                   help="offline SARSA's a': 'policy' = epsilon-greedy on the learner's table (default), 'data' = behaviour's a'")
    g.add_argument("--merge", choices=MERGES, default="mean", help="how worker tables are merged each round (default mean)")
    g.add_argument("--backend", choices=BACKENDS, default="threads", help="worker parallelism (default threads)")
    g.add_argument("--frac-bits", type=int, default=None, help="int32 fraction bits (default: largest <= 16 safe for the reward range)")
    g.add_argument("--sync-every", type=int, default=None, help="online: steps per worker between merges (sets --rounds)")
    d = p.add_argument_group("data")
    d.add_argument("--data", default=None, help="load the offline dataset from this .npz instead of generating it")
    d.add_argument("--save-data", default=None, help="write the generated dataset to this .npz")
    d.add_argument("--behaviour", choices=BEHAVIOURS, default="random", help="behaviour policy of the dataset")
    d.add_argument("--behaviour-q", default=None, help="Q-table .npy for --behaviour epsilon-greedy")
    d.add_argument("--behaviour-epsilon", type=float, default=0.1, help="exploration of the epsilon-greedy behaviour")
    d.add_argument("--env-kwarg", action="append", default=None, metavar="KEY=VALUE",
                   help="extra gym.make argument, repeatable (e.g. is_slippery=false)")
    e = p.add_argument_group("output")
    e.add_argument("--eval-episodes", type=int, default=None, help="greedy evaluation episodes (default 100; FrozenLake 1000)")
    e.add_argument("--no-scaling-reference", action="store_true",
                   help="skip the single-worker reference pass used for scaling_efficiency")
    e.add_argument("--json", action="store_true", help="print result.json to stdout instead of the summary")


def register(subparsers) -> None:
    """Add the `tabular` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "tabular", help="parallel tabular Q-learning / SARSA (SwiftRL on CPU cores)",
        description="Parallel tabular Q-learning and SARSA: W workers learn on shards of experience "
                    "with compiled kernels and their Q-tables are merged every round.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from hetrl.tabular import train_tabular
    from hetrl.tabular.envs import parse_env_kwargs

    res = train_tabular(
        args.algo, args.env, workers=args.workers, transitions=args.transitions, rounds=args.rounds,
        dtype=args.dtype, mode=args.mode, out=args.out, seed=args.seed, alpha=args.alpha,
        alpha_final=args.alpha_final, gamma=args.gamma, epsilon=args.epsilon,
        epsilon_final=args.epsilon_final, merge=args.merge, backend=args.backend,
        sarsa_next=args.sarsa_next, data=args.data, save_data=args.save_data, behaviour=args.behaviour,
        behaviour_q=args.behaviour_q, behaviour_epsilon=args.behaviour_epsilon,
        env_kwargs=parse_env_kwargs(args.env_kwarg), eval_episodes=args.eval_episodes,
        frac_bits=args.frac_bits, sync_every=args.sync_every,
        measure_scaling=not args.no_scaling_reference, force=args.force)
    r = res.result
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(summary(r))
    return 0


def _fmt_rate(x) -> str:
    return "n/a" if x is None else f"{x / 1e6:.1f} M/s"


def summary(r: dict) -> str:
    env = r["env_id"] if r["env_id"] == r["env"] else f"{r['env']} -> {r['env_id']}"
    lines = [
        f"{r['algo']} on {env}: {r['mode']}, {r['workers']} worker(s), {r['dtype']}"
        + (f" (scale 2^{r['frac_bits']})" if r.get("frac_bits") is not None else "")
        + f", merge {r['merge']}",
        f"  data       {r['transitions']:,} transitions ({r['data_source']}), {r['data_s']:.2f} s",
        f"  training   {r['rounds']} rounds, {r['updates']:,} updates in {r['wall_s']:.3f} s",
        f"  speed      {_fmt_rate(r['updates_per_s'])} total, {_fmt_rate(r['updates_per_s_per_worker'])} per worker"
        + (f", scaling efficiency {r['scaling_efficiency']:.2f} (vs {_fmt_rate(r['single_worker_updates_per_s'])} alone)"
           if r.get("scaling_efficiency") else ""),
    ]
    if r.get("eval_episodes"):
        lines.append(f"  greedy     return {r['eval_return_mean']:.3f} +- {r['eval_return_std']:.3f}, success "
                     f"{r['success_rate']:.3f} over {r['eval_episodes']} episodes")
    if r.get("out"):
        lines.append(f"  saved      {r['out']}/q_table.npy, {r['out']}/result.json")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hetrl")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["tabular", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
