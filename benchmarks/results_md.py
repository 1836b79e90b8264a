"""docs/results.md from benchmarks/results/: the latest result of every case on every machine.

    python benchmarks/results_md.py            # writes docs/results.md and README.md's table of figures
    python benchmarks/results_md.py --check    # exit 1 where either differs from what it would write, or
                                               # a result file breaks the naming scheme or is superseded

Every figure on the page is read from a result file named as benchmarks/result_files.py says; each
benchmark has an extractor below that turns its JSON into one line of figures per case. A file's
case on a machine is superseded by a newer file of the same benchmark, case and machine that measured
at least what it measured (the same libraries, variants or sections): the page leaves it out and
`--check` asks to remove the file (history stays in git). Figures kept by hand, where no file was
kept, live in `notes_*.json` files ({"topic", "command", "figures"}); the machines in machines.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from result_files import RESULTS, parse

ROOT = RESULTS.parents[1]
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
MACHINES = RESULTS / "machines.json"
MAX_LINES = 200
README_BEGIN = "<!-- figures: written by benchmarks/results_md.py from benchmarks/results/; do not edit -->"
README_END = "<!-- /figures -->"

TOPICS = {   # id: (section title, what its rows hold)
    "dqn": ("DQN and DDPG against SB3 and SBX",
            "Env steps/s over the whole run (warm-up included), medians of the rounds; hetrl under its default plan."),
    "ac": ("SAC, TD3 and CrossQ against SB3 and SBX",
           "Env steps/s over the whole run with the presets' warm-up, medians of the rounds."),
    "atari": ("Atari", "DQN on Breakout-v5: speed against SB3's `CnnPolicy`, the CNN update, memory, learning."),
    "kernels": ("Learner kernels", "The learner alone, one thread, ms per update (lower is faster); the share of "
                "the one-thread matmul peak where measured."),
    "learning": ("Learning", "Evaluation returns: the kept policy on 10 fresh episodes (deterministic) unless the "
                 "row says; rl-zoo's scores: DQN CartPole 500, DDPG Pendulum -152, TD3 Pendulum -152, SAC Pendulum -157."),
    "populations": ("Populations", "Many seeds as one run against one seed alone, the seeds as separate runs two at "
                    "a time (pairs) and SB3 one after another; wall times of whole processes."),
    "sb3api": ("SB3-style classes", "`from hetrl import DQN` against `hetrl.train` with the same settings."),
    "schedules": ("Local and Ray schedules", "Actor processes and Ray against one process; replay latency."),
    "planner": ("Planner", "The planner's pick and prediction against measured runs of several plans."),
    "versions": ("Before and after", "One version of hetrl against another on the same machine, alternating."),
    "memory": ("Long runs, memory and a shared CPU", ""),
    "tabular": ("Tabular", "Parallel Q-learning and SARSA on CPU cores (docs/tabular.md)."),
    "gpu": ("GPU", "`benchmarks/gpu_check.py` (docs/gpu.md): the learner alone, updates/s; CPU: one host thread."),
}


@dataclass
class Entry:
    """One case a result file measured."""
    topic: str
    case: str                                       # with benchmark and machine: what a newer file supersedes
    text: str                                       # its figures, markdown
    measures: frozenset = field(default_factory=frozenset)   # a newer file supersedes it if it measures these too


@dataclass
class Result:
    path: Path
    name: dict
    doc: dict
    entries: list
    lead: str = ""
    when: str = ""

    @property
    def key(self):
        return (self.name["date"], self.when)


# --- formatting -----------------------------------------------------------------------------------------------

def num(x, digits: int = 3) -> str:
    """3 significant figures, thousands separated: 6,312, 241, 88.2, 0.316."""
    if x is None:
        return "-"
    x = float(x)
    if abs(x) >= 1e7:
        return f"{x:.1e}"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - int(f"{abs(x):e}".split("e")[1]))
    return f"{x:.{decimals}f}"


def ret(x) -> str:
    """An evaluation return: one decimal."""
    return f"{x:,.1f}" if abs(x) < 1000 else f"{x:,.0f}"


def ratio(x) -> str:
    return f"{x:.2f}x"


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


LABEL = {"dqn": "DQN", "ddpg": "DDPG", "td3": "TD3", "sac": "SAC", "crossq": "CrossQ", "ppo": "PPO", "a2c": "A2C", "qrdqn": "QR-DQN", "sb3": "SB3", "sbx": "SBX"}


def label(x: str) -> str:
    return LABEL.get(x, x)


def steps_k(n) -> str:
    return f"{n / 1000:g}k" if n and n % 100 == 0 and n >= 1000 else str(n)


def extra_text(extra: dict) -> str:
    return "".join(f", {k}={v}" for k, v in (extra or {}).items())


def command_of(doc: dict, bench: str) -> str:
    """The command that wrote the file, without its output path."""
    cmd = doc.get("command") or ""
    if bench == "soak":   # its "command" is the run it watched
        cmd = "python benchmarks/soak.py"
    cmd = re.sub(r"\s--out(=|\s+)\S+", "", cmd).strip()
    python = "python3" if bench == "gpu_check" else "python"   # the GPU machine's interpreter
    cmd = re.sub(r"^(python3?\s+)?(benchmarks/)?(?=\w+\.py\b)", f"{python} benchmarks/", cmd)
    return cmd


# --- extractors: a result file's JSON -> (lead, [Entry]) -------------------------------------------------------

def _how(run: dict) -> str:
    """How hetrl ran, as far as the file says: "inline, compiled kernel, 2 threads"."""
    parts = [run.get("schedule"), run.get("learner_kernel") and f"{run['learner_kernel']} kernel",
             run.get("threads") and f"{run['threads']} thread{'s' * (run['threads'] != 1)}"]
    return ", ".join(p for p in parts if p)


def bench_sb3(doc):
    entries, rounds, hows = [], set(), []
    for c in doc["cases"]:
        algo, env = c["algo"], c["env"]
        medians = c["median_env_steps_per_s"]
        libs = list(medians)
        rounds.add(max(len(v) for v in c["runs"].values()))
        ratios = c.get("ratios") or {f"hetrl/{lib}": medians["hetrl"] / medians[lib] for lib in libs if lib != "hetrl"}
        figs = " / ".join(f"{label(lib)} {num(medians[lib])}" for lib in libs)
        rat = ", ".join(f"**{ratio(v)} {label(k.split('/')[1])}**" for k, v in ratios.items())
        hows.append(_how((c["runs"].get("hetrl") or [{}])[0]))
        topic = "atari" if env.startswith("ALE/") else "dqn" if algo in ("dqn", "ddpg") else "ac"
        text = f"{label(algo)} {env} {steps_k(c['steps'])}{extra_text(c.get('extra'))}: {figs} env steps/s: {rat}"
        entries.append(Entry(topic, f"{algo}:{env}:{c['steps']}{extra_text(c.get('extra'))}", text, frozenset(libs)))
    n = max(rounds)
    how = "; ".join(dict.fromkeys(h for h in hows if h))
    return f"median of {n} round{'s' * (n > 1)}" + (f", hetrl {how}" if how else "") + ":", entries


def bench_learner_kernels(doc):
    ms = sorted(doc["median_s_per_update"].items(), key=lambda kv: kv[1])
    figs = ", ".join(f"{k} {'**' * (i == 0)}{num(v * 1e3)}{'**' * (i == 0)}" for i, (k, v) in enumerate(ms))
    net = "x".join(map(str, doc["net_arch"]))
    text = (f"DQN {doc['env']} update (batch {doc['batch_size']}, {net}, {doc['updates_per_phase']} updates per phase"
            f"{', GEMM ' + doc['gemm'] if doc.get('gemm') else ''}), ms, median of {doc['rounds']} rounds: {figs}")
    return "", [Entry("kernels", f"dqn-update:{doc['env']}", text)]


def bench_sac_td3_update(doc):
    entries = []
    for algo, a in doc["algos"].items():
        m = a["ms_per_update"]
        comp = m.get("compiled")
        share = ""
        if comp and a.get("peak_gflops"):
            share = f", {a['gflop_per_update'] / (comp / 1e3) / a['peak_gflops']:.0%} of the {num(a['peak_gflops'])} GFLOP/s peak"
        per_call = f", {a['updates_per_call']} per call" if a.get("updates_per_call", 1) > 1 else ""
        others = " / ".join(f"{k} {num(v)}" for k, v in m.items() if k != "compiled")
        text = (f"{label(algo)} ({'x'.join(map(str, a['net_arch']))}{per_call}): compiled **{num(comp)}** / {others} ms"
                f"{share}")
        entries.append(Entry("kernels", f"{algo}-update", text))
    t = doc.get("threads", 1)
    lead = f"{'one thread' if t == 1 else f'{t} threads'}, GEMM {doc.get('gemm', '?')}, ms per update:"
    return lead, entries


def bench_cnn_layout(doc):
    figs = "; ".join(f"{t} thread{'s' * (t != '1')}: NCHW {num(v['median']['nchw'])} / NHWC {num(v['median']['nhwc'])} ms"
                     for t, v in doc["ms_per_update"].items())
    return "", [Entry("atari", "cnn-layout", f"the Nature CNN's DQN update (batch {doc['batch_size']}) alone: {figs}")]


def bench_atari_memory(doc):
    m = doc["measured"]
    text = (f"{doc['game']} replay, measured RSS growth per transition: frames stored once "
            f"**{num(m['frames']['bytes_per_transition'])} B**, both stacks (SB3's layout) "
            f"{num(m['plain']['bytes_per_transition'])} B: {num(m['frames']['replay_1M_bytes_scaled'] / 1e9)} GB "
            f"against {num(m['plain']['replay_1M_bytes_scaled'] / 1e9)} GB for 1M transitions")
    return "", [Entry("atari", "replay-memory", text)]


def bench_population(doc):
    entries = []
    names = {"population": "one process", "groups": "groups", "one": "one seed", "pairs": "pairs", "sb3": "SB3 (one seed)"}
    for c in doc["cases"]:
        walls = ", ".join(f"{names.get(k, k)} {num(v)} s" for k, v in c["median_wall_s"].items())
        rats = ", ".join(f"{k.replace('sb3_x_seeds', 'SB3 x seeds').replace('population', 'one process')} "
                         f"**{v:.2f}**" for k, v in c["ratios"].items())
        mem = c.get("memory") or {}
        rss = ", ".join(f"{names.get(k[:-len('_peak_rss_mb')], k)} {num(v)} MB" for k, v in mem.items()
                        if k.endswith("_peak_rss_mb") and not k.startswith("one"))
        text = (f"{doc['seeds']} seeds of {label(c['algo'])} {c['env']} {steps_k(c['steps'])}: {walls}; time ratios {rats}"
                + (f"; peak RSS {rss} (one seed {num(mem['one_peak_rss_mb'])} MB)" if rss else ""))
        entries.append(Entry("populations", f"{c['algo']}:{c['env']}:{c['steps']}:{doc['seeds']}", text,
                             frozenset(c["median_wall_s"])))
    return "", entries


def bench_versions(doc):
    entries = []
    for case, s in doc["summary"].items():
        m, r = s["median_env_steps_per_s"], s["ratio_to_before"]
        base = next(iter(m))
        figs = ", ".join(f"{k} {num(v)}" + (f" (**{ratio(r[k])}**)" if k != base else "") for k, v in m.items())
        entries.append(Entry("versions", case, f"{case}: {figs} env steps/s"))
    return "", entries


def bench_acting(doc):
    m = doc["median_s_per_env_step"]
    base = next(iter(m))
    entries = []
    for case in doc["cases"]:
        figs = ", ".join(f"{k} {num(v[case] * 1e6)}" + (f" (**{ratio(m[base][case] / v[case])}**)" if k != base else "")
                         for k, v in m.items())
        entries.append(Entry("versions", f"acting {case}", f"acting {case}: {figs} us per env step"))
    return "", entries


LOCAL = {"sb3": "SB3", "inline-1t": "inline (1 thread)", "local-2t": "local (2 learner threads)"}


def _medians(section: dict) -> str:
    return ", ".join(f"{LOCAL.get(k, k)} {num(v['env_steps_per_s'])}" for k, v in section["median"].items())


def bench_local(doc):
    parts, sections = [], []
    if "dqn_throughput" in doc:
        s = doc["dqn_throughput"]
        parts.append(f"DQN CartPole-v1 {steps_k(s['steps'])} env steps/s: {_medians(s)} (local / SB3 "
                     f"**{ratio(s['local_vs_sb3'])}**)")
        sections.append("dqn_throughput")
    if "ddpg_throughput" in doc:
        s = doc["ddpg_throughput"]
        parts.append(f"DDPG Pendulum-v1 {steps_k(s['steps'])}{extra_text(s.get('extra'))}: {_medians(s)} (local / SB3 "
                     f"**{ratio(s['local_vs_sb3'])}**)")
        sections.append("ddpg_throughput")
    if "dqn_t475" in doc:
        s = doc["dqn_t475"]
        parts.append("DQN seconds to an evaluation >= 475: " + ", ".join(f"{LOCAL.get(k, k)} {num(v['t475_s'])}"
                                                                        for k, v in s["median"].items()))
        sections.append("dqn_t475")
    if "sweep" in doc:
        s = doc["sweep"]["preset_ratio"]
        parts.append("actors " + ", ".join(s) + " at the preset's ratio: " + ", ".join(num(v["env_steps_per_s"]) for v in s.values()))
        sections.append("sweep")
    if "pays" in doc:
        for k, v in doc["pays"].items():
            if isinstance(v, dict) and "local_vs_inline" in v:
                parts.append(f"{k}: local / inline **{ratio(v['local_vs_inline'])}**")
        sections.append("pays")
    return "", [Entry("schedules", "local", "; ".join(parts), frozenset(sections))]


def bench_ray(doc):
    entries = []
    if "replay" in doc:
        lat = ", ".join(f"batch {r['batch']}: insert {num(r['local_insert']['p50_us'])} us local / "
                        f"{num(r['ray_insert']['p50_us'] / 1e3)} ms Ray" for r in doc["replay"] if r["batch"] in (32, 1024))
        entries.append(Entry("schedules", "ray-replay", f"replay latency p50, {lat}"))
    if "schedule" in doc:
        s = doc["schedule"]
        entries.append(Entry("schedules", "ray-schedule",
                             f"DQN CartPole-v1 {steps_k(s['steps'])}: ray {num(s['median']['ray']['env_steps_per_s'])}, local "
                             f"{num(s['median']['local']['env_steps_per_s'])} env steps/s (**{ratio(s['ray_vs_local'])}**)"))
    if "per" in doc:
        s = doc["per"]
        figs = ", ".join(f"{k} {num(v['env_steps_per_s_learning'])}" for k, v in s["median"].items())
        entries.append(Entry("schedules", "ray-per", f"DQN CartPole-v1 {steps_k(s['steps'])}, prioritized replay, ray "
                                                     f"schedule, env steps/s while learning: {figs}"))
    if "median" in doc and "what" in doc:   # the prioritized-replay comparison as first kept
        figs = ", ".join(f"{k} {num(v)}" for k, v in doc["median"].items())
        entries.append(Entry("schedules", "ray-per", f"{doc['what']}; {doc['figure'].split(':')[0]}: {figs}"))
    return "", entries


def bench_policy_lag(doc):
    by = {}
    for r in doc["runs"]:
        if "error" not in r:
            by.setdefault(r["variant"], []).append(r)
    parts = []
    for v, rs in by.items():
        parts.append(f"{v}: best {' / '.join(ret(r['best']) for r in rs)}, last {' / '.join(ret(r['final']) for r in rs)}, "
                     f"lag mean {num(med(r['lag_mean'] for r in rs))}, {num(med(r['env_steps_per_s'] for r in rs))} env steps/s")
    first = next(iter(by.values()))
    steps = re.search(r"--steps (\d+)", first[0].get("command", ""))
    return (f"DQN CartPole-v1 {steps_k(int(steps.group(1))) if steps else ''}, local schedule, seeds "
            + ", ".join(str(r["seed"]) for r in first) + ":"), [Entry("schedules", "policy-lag", "; ".join(parts))]


def bench_planner(doc):
    entries = []
    for w in doc["workloads"]:
        s = w["summary"]
        pred = w["auto_plan"]["predicted"]["env_steps_per_s"]
        text = (f"{w['workload']}: the pick ({s['best_measured_plan'] if s['auto_over_best_measured'] == 1 else 'auto'}) "
                f"predicted {num(pred)}, measured {num(s['auto_measured'])} env steps/s (**{s['auto_measured'] / pred:.2f}**); "
                f"pick / best of {s['runs']} plans measured **{s['auto_over_best_measured']:.2f}**")
        entries.append(Entry("planner", w["workload"], text))
    return "", entries


def bench_learning(doc):
    zoo = doc["zoo_score"]
    by = {}
    for r in doc["runs"]:
        by.setdefault((r["algo"], r["env"]), {}).setdefault(r["run"], []).append(r)
    parts = []
    for (algo, env), runs in by.items():
        auto = sorted(runs.get("auto", []), key=lambda r: r["seed"])
        sb3 = runs.get("sb3", [])
        parts.append(f"{label(algo)} {env} (zoo {ret(zoo[f'{algo} {env}'])}): best "
                     f"{' / '.join(ret(r['best']) for r in auto)}, "
                     f"{sum(r['reached'] for r in auto)}/{len(auto)} reached, {num(med(r['wall_s'] for r in auto))} s"
                     + (f" (SB3 seed 0: {ret(sb3[0]['best'])}, {num(sb3[0]['wall_s'])} s)" if sb3 else ""))
    return "default plan, seeds 0 / 1 / 2:", [Entry("learning", "learning-equivalence", "; ".join(parts))]


def bench_sb3_api(doc):
    entries = []
    for c in doc["cases"]:
        if "hetrl_over_sb3_speed" in c:   # --script: SB3's script with either import
            t = {lib: med(r["seconds"] for r in c["runs"] if r["lib"] == lib) for lib in ("hetrl", "sb3")}
            ev = {lib: med(r["eval_mean"] for r in c["runs"] if r["lib"] == lib) for lib in ("hetrl", "sb3")}
            entries.append(Entry("sb3api", c["case"], f"`{c['case']}`, SB3's script with only its import changed: "
                                                     f"hetrl / SB3 speed **{c['hetrl_over_sb3_speed']:.2f}x** "
                                                     f"({num(t['hetrl'])} / {num(t['sb3'])} s), eval "
                                                     f"{num(ev['hetrl'])} / {num(ev['sb3'])}"))
            continue
        t = {h: med(r["seconds"] for r in c["runs"] if r["how"] == h) for h in ("class", "train")}
        entries.append(Entry("sb3api", c["case"], f"`{c['case']}`: class / train time **{c['class_over_train_time']:.2f}** "
                                                 f"({num(t['class'])} / {num(t['train'])} s)"))
    return "", entries


def tabular_scaling(doc):
    rows = doc["results"]
    if "checks" in doc:   # the scaling study
        parts = [f"{c['transitions'] / 1e6:g}M {c['dtype']} {num(c['per_worker_1'] / 1e6)} / {num(c['per_worker_2'] / 1e6)} "
                 f"(**{ratio(c['speedup_1_to_2'])}**)" for c in doc["checks"]]
        return "", [Entry("tabular", "scaling", f"{doc['env']} Q-learning, M updates/s per worker, 1 / 2 workers: " + ", ".join(parts))]
    if rows and "merge" in rows[0]:   # one setting of the study: Taxi, 10 rounds, 16 workers
        rs = [r for r in rows if (r["env"], r["rounds"], r["workers"]) == ("Taxi-v3", 10, 16)] or rows[:3]
        figs = ", ".join(f"{r['merge']} {num(r['q_error_mean'])} ({num(r['eval_return_mean'])})" for r in rs)
        return "", [Entry("tabular", "merge", f"{rs[0]['env']}, {rs[0]['rounds']} rounds, {rs[0]['workers']} workers, "
                                              f"mean abs(Q - Q*) after merging the workers' tables (evaluation return): {figs}; "
                                              f"{len(rows)} settings in the file")]
    by = {}
    for r in rows:
        by.setdefault(r["env"], []).append(r)
    parts = []
    for env, rs in by.items():
        vals = [r["success_rate"] if "FrozenLake" in env else r["eval_return_mean"] for r in rs]
        span = num(min(vals)) if min(vals) == max(vals) else f"{num(min(vals))} to {num(max(vals))}"
        parts.append(f"{env} {'success ' if 'FrozenLake' in env else ''}{span}")
    return "", [Entry("tabular", "learning", f"from {rows[0]['transitions'] / 1e6:g}M random transitions, Q-learning and "
                                             f"SARSA, float32 and int32, seeds 0-2: " + ", ".join(parts))]


def soak(doc):
    r = doc["run"]
    text = (f"`{doc['command'].split(' --out ')[0]}`: {num(r['env_steps'])} env steps in {num(r['wall_s'])} s "
            f"({num(r['env_steps_per_s'])} env steps/s), {r['actor_restarts']} actor restarts, best policy "
            f"{num(r['eval_return_mean'])}; total RSS after warm-up {num(doc['rss_after_warmup_mb']['min'])}-"
            f"{num(doc['rss_after_warmup_mb']['max'])} MB over {doc['steady_processes']} processes: **{doc['drift_after_warmup']:.1%} drift**")
    return "", [Entry("memory", "soak", text)]


def bench_busy(doc):
    entries = []
    for name, case in doc["cases"].items():
        # (results before the quiet phase hold the loaded phase's figures in the case itself)
        for phase, c in (case.get("phases") or {"loaded": case}).items():
            med, best = c["median_env_steps_per_s_learning"], c["best_hand_set"]
            plan = (c.get("default_plans") or [{}])[-1]
            how = "beside a one-core CPU hog" if phase == "loaded" else "with no hog"
            verdicts = c.get("verdicts") or {}
            judged = "".join(f"; {'PASS' if ok else 'FAIL'}: {k}" for k, ok in verdicts.items())
            text = (f"{label(case['algo'])} {case['env']} {steps_k(case['steps'])}, profiled {how} "
                    f"({c['profile']['provisional']} entries provisional), then trained with the hog gone: default plan "
                    f"({plan.get('schedule')}, {plan.get('threads')} thr) {num(med['default'])} env steps/s, best "
                    f"hand-set ({best}) {num(med[best])}: **{c['default_over_best_hand_set']:.2f}**; default measured / "
                    f"predicted **{c['default_measured_over_predicted']:.2f}**{judged}")
            entries.append(Entry("planner", f"busy:{name}" + (f":{phase}" if "phases" in case else ""), text))
    return f"median of {doc['rounds']} round{'s' * (doc['rounds'] > 1)}, alternating:", entries


def bench_lanes_busy(doc):
    entries = []
    for name, c in doc["cases"].items():
        if "blocks_over_split_1" in c:   # --blocks-cost: the heads' fixed row blocks against one block per lane
            m = c["median_ms"]
            entries.append(Entry("kernels", f"lanes-blocks:{name}", (
                f"{label(name)} compiled head, fixed row blocks against one block per lane, ms per learn call: one "
                f"lane {num(m['blocks_1'])} / {num(m['split_1'])} (**{c['blocks_over_split_1']:.2f}**), two lanes "
                f"{num(m['blocks_2'])} / {num(m['split_2'])} (**{c['blocks_over_split_2']:.2f}**)")))
        for path in ("head", "derived"):
            if path not in c:
                continue
            m = c[path]["median_ms"]
            text = (f"{label(name)} compiled kernel ({path} phase), ms per learn call: one lane {num(m['quiet_1'])}, two "
                    f"lanes {num(m['quiet_2'])}; beside a one-core CPU hog: two lanes {num(m['hog_2'])}, one lane "
                    f"{num(m['hog_1'])}; two lanes beside the hog / one lane quiet **{c[path]['hog_2_over_quiet_1']:.2f}**")
            entries.append(Entry("kernels", f"lanes-busy:{name}:{path}", text))
    return f"median of {doc['rounds']} rounds, alternating:", entries


def bench_shared_cpu(doc):
    text = (f"DQN CartPole-v1 alone, then beside a competing torch training: {num(doc['solo_env_steps_per_s'])} env "
            f"steps/s alone, {num(doc['shared_env_steps_per_s'])} beside it (**{doc['ratio']:.2f}** of alone); learner "
            f"threads planned {doc.get('learner_threads_planned')}, at least {doc.get('learner_threads_min')}")
    return "", [Entry("memory", "shared-cpu", text)]


def gpu_check(doc):
    st = doc["stages"]
    parts = []
    tests = st.get("tests", {})
    if tests.get("status") == "ok":
        parts.append("tests marked `gpu`: " + ", ".join(f"{v} {k}" for k, v in tests["counts"].items() if k != "deselected"))
    elif tests:
        parts.append(f"tests marked `gpu`: no result ({tests.get('reason') or tests.get('status')})")
    for case, c in (st.get("learner", {}).get("cases") or {}).items():
        v = c["variants"]

        def ups(*names):
            for n in names:
                if n in v and v[n].get("updates_per_s"):
                    return v[n]
            return None
        cols = [("CPU", ups("cpu_public", "cpu_1t")), ("compiled", ups("cpu_compiled")), ("eager", ups("cuda_eager")),
                ("graph", ups("cuda_graph", "cuda_graph_k2"))]
        figs = " / ".join(f"{n} {num(x['updates_per_s'])}" for n, x in cols if x)
        g = cols[3][1]
        if g:
            check = g.get("check") or {}
            mism = check.get("ok", check.get("match")) is False
            figs += " (graph " + ("differs from eager" if mism else "checked equal") + ")"
        parts.append(f"{case} {figs}")
    return "", [Entry("gpu", "gpu_check", "; ".join(parts), frozenset(doc.get("stages_run", [])))]


def train(doc):
    runs = doc["runs"] if "runs" in doc else [doc]
    algo = doc.get("algo") or runs[0].get("algo")
    by = {}
    for r in runs:
        by.setdefault(r["env"], []).append(r)
    entries = []
    for env, rs in by.items():
        rs = sorted(rs, key=lambda r: r.get("seed", 0))
        best = " / ".join(f"**{ret(r['eval_return_mean'])}**" + (f" ± {num(r['eval_return_std'])}" if len(rs) == 1 else "")
                          for r in rs)
        last = " / ".join(ret(r["final_eval_return_mean"]) for r in rs)
        steps = max(r["env_steps"] for r in rs)
        seeds = " / ".join(str(r.get("seed", 0)) for r in rs)
        text = (f"{label(algo)} {env} {steps_k(steps)}, seed{'s' * (len(rs) > 1)} {seeds}: best {best}, last {last}; "
                f"{num(med(r['env_steps_per_s'] for r in rs))} env steps/s, {num(med(r['wall_s'] for r in rs))} s"
                + (f" ({rs[0]['schedule']}, {rs[0]['learner_kernel']} kernel)" if rs[0].get("schedule") else ""))
        entries.append(Entry("learning", f"{algo}:{env}", text))
    return "", entries


def notes(doc):
    return "", [Entry(doc["topic"], doc.get("case", "notes"), doc["figures"])]


EXTRACTORS = {f.__name__: f for f in (bench_sb3, bench_learner_kernels, bench_sac_td3_update, bench_cnn_layout,
                                      bench_atari_memory, bench_population, bench_versions, bench_local, bench_ray,
                                      bench_policy_lag, bench_planner, bench_learning, bench_sb3_api, tabular_scaling,
                                      soak, bench_shared_cpu, bench_busy, bench_lanes_busy, gpu_check, train, notes,
                                      bench_acting)}


# --- reading the results ---------------------------------------------------------------------------------------

def _time_of_day(doc: dict) -> str:
    for k in ("when", "started", "date", "time", "created"):
        m = re.search(r"\d{2}:\d{2}(:\d{2})?", str(doc.get(k, "")))
        if m:
            return m.group(0)
    return ""


def load(folder: Path = RESULTS) -> tuple[list[Result], list[str]]:
    """Every result under folder, and the problems found (names off the scheme, missing commands, ...)."""
    results, problems = [], []
    machines = json.loads((folder / "machines.json").read_text()) if (folder / "machines.json").exists() else {}
    stems = set()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if path.name == "machines.json":
            continue
        name = parse(path.name)
        if name is None:
            problems.append(f"{rel}: not named <benchmark>_<case>_<YYYY-MM-DD>_<machine>_<commit> "
                            "(benchmarks/result_files.py)")
            continue
        if name["machine"] not in machines:
            problems.append(f"{rel}: machine '{name['machine']}' is not in benchmarks/results/machines.json; add it")
        if path.suffix != ".json":
            continue
        stems.add((path.parent, *(name[k] for k in ("benchmark", "case", "date", "machine", "commit"))))
        try:
            doc = json.loads(path.read_text())
            extract = EXTRACTORS.get(name["benchmark"])
            if extract is None:
                problems.append(f"{rel}: no extractor for benchmark '{name['benchmark']}' in benchmarks/results_md.py")
                continue
            lead, entries = extract(doc)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError) as e:
            problems.append(f"{rel}: cannot read its figures ({type(e).__name__}: {e})")
            continue
        if not command_of(doc, name["benchmark"]):
            problems.append(f"{rel}: no \"command\" in the file; add the command that made it")
        results.append(Result(path, name, doc, entries, lead, _time_of_day(doc)))
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".json"):
        name = parse(path.name)
        if name and (path.parent, *(name[k] for k in ("benchmark", "case", "date", "machine", "commit"))) not in stems:
            problems.append(f"{path.relative_to(folder)}: no result JSON of the same name beside it")
    return results, problems


def _commit_time(commit: str) -> int:
    out = subprocess.run(["git", "show", "-s", "--format=%ct", commit], cwd=ROOT, capture_output=True, text=True)
    return int(out.stdout.strip() or 0)


def latest(results: list[Result]) -> tuple[dict, list[str]]:
    """{id(result): its entries still current}, and the results none of whose entries is (superseded)."""
    groups = {}
    for r in results:
        for e in r.entries:
            groups.setdefault((r.name["benchmark"], e.case, r.name["machine"]), []).append((r, e))
    current = {id(r): [] for r in results}
    for members in groups.values():
        keys = [r.key for r, _ in members]
        if len(set(keys)) < len(keys):   # the same day without a time of day: the commits' order decides
            members.sort(key=lambda m: (m[0].key, _commit_time(m[0].name["commit"])))
        else:
            members.sort(key=lambda m: m[0].key)
        for i, (r, e) in enumerate(members):
            if not any(f.measures >= e.measures for _, f in members[i + 1:]):
                current[id(r)].append(e)
    return current, [r for r in results if not current[id(r)]]


# --- writing ---------------------------------------------------------------------------------------------------

def cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def link(r: Result) -> str:
    rel = r.path.relative_to(ROOT).as_posix()
    return f"[{r.path.name}](../{rel})"


def page(results: list[Result], current: dict) -> str:
    machines = json.loads(MACHINES.read_text())
    shown = [r for r in results if current[id(r)]]
    dates = {}
    for r in shown:
        dates.setdefault(r.name["machine"], set()).add(r.name["date"])
    L = ["# Results", "",
         "<!-- Written by `python benchmarks/results_md.py` from benchmarks/results/: edit those files, then run it. -->",
         "",
         "The latest result of every benchmark case on every machine, read from the result files in",
         "[benchmarks/results/](../benchmarks/results/) (`<benchmark>_<case>_<date>_<machine>_<commit>.json`; older",
         "results of a case are in git's history). Each row: the date, the machine (below), the commit measured, the",
         "command, the figures and the file. Unless a row says otherwise: torch 2.13 CPU, the rl-baselines3-zoo presets",
         "(`hetrl/algos/*.yaml`), hetrl under its default plan, Stable-Baselines3 2.9.2, SBX 0.28 on jax 0.10.2;",
         "speed figures are medians of rounds that alternate the contenders in fresh processes. The machines are",
         "2-core VMs shared with other jobs: compare figures within a row, not across rows.", "",
         "## Machines", "", "| key | machine | results |", "|---|---|---|"]
    for key, m in machines.items():
        if key in dates:
            L.append(f"| {key} | {cell(m['description'])} | {', '.join(sorted(dates[key]))} |")
    by_topic = {}
    for r in shown:
        for e in current[id(r)]:
            by_topic.setdefault(e.topic, {}).setdefault(id(r), (r, []))[1].append(e)
    for topic, (title, intro) in TOPICS.items():
        if topic not in by_topic:
            continue
        L += ["", f"## {title}", ""] + ([intro, ""] if intro else [])
        L += ["| date | machine | commit | command | figures | file |", "|---|---|---|---|---|---|"]
        rows = sorted(by_topic[topic].values(), key=lambda re_: (re_[0].key, re_[0].name["commit"]), reverse=True)
        for r, es in rows:
            figs = "; ".join(e.text for e in es)
            if r.lead:
                figs = f"{r.lead} {figs}"
            if r.doc.get("note") and isinstance(r.doc["note"], str):
                figs += f"; {r.doc['note']}"
            cmd = command_of(r.doc, r.name["benchmark"])
            L.append(f"| {r.name['date']} | {r.name['machine']} | {r.name['commit']} | `{cell(cmd)}` | {cell(figs)} | {link(r)} |")
    return "\n".join(L) + "\n"


README_CASES = [   # README's columns: bench_sb3 cases, and whom hetrl is compared with
    ("dqn:CartPole-v1:50000", "DQN CartPole-v1 50k"),
    ("td3:Pendulum-v1:20000", "TD3 Pendulum-v1 20k"),
    ("sac:Pendulum-v1:20000", "SAC Pendulum-v1 20k"),
    ("sac:HalfCheetah-v5:20000", "SAC HalfCheetah-v5 20k"),
    ("crossq:Pendulum-v1:20000", "CrossQ Pendulum-v1 20k"),
    ("dqn:ALE/Breakout-v5:25000, learning_starts=5000", "DQN Breakout-v5 25k"),
]


def readme_table(results: list[Result], current: dict) -> str:
    """README's figures: per machine and day, hetrl's speed over SB3's and SBX's on the cases above."""
    machines = json.loads(MACHINES.read_text())
    cells = {}
    for r in results:
        if r.name["benchmark"] != "bench_sb3":
            continue
        for e in current[id(r)]:
            col = next((i for i, (c, _) in enumerate(README_CASES) if c == e.case), None)
            if col is None:
                continue
            c = next(c for c in r.doc["cases"] if f"{c['algo']}:{c['env']}:{c['steps']}{extra_text(c.get('extra'))}" == e.case)
            rat = c.get("ratios") or {}
            txt = " / ".join(f"{ratio(rat[k])}" if k in rat else "-" for k in ("hetrl/sb3", "hetrl/sbx"))
            cells.setdefault(r.name["machine"], {})[col] = (txt, r.name["date"])
    L = ["| CPU, 2 cores | " + " | ".join(t for _, t in README_CASES) + " | date |",
         "|---" * (len(README_CASES) + 2) + "|"]
    for m in (m for m in machines if m in cells):   # a row per machine; a cell of another day says its date
        row = cells[m]
        days = [d for _, d in row.values()]
        date = max(set(days), key=lambda d: (days.count(d), d))
        L.append(f"| {machines[m]['short']} | " + " | ".join(
            (row[i][0] + (f" ({row[i][1]})" if row[i][1] != date else "")) if i in row else ""
            for i in range(len(README_CASES))) + f" | {date} |")
    gpu = []
    for r in sorted((r for r in results if r.name["benchmark"] == "gpu_check" and current[id(r)]),
                    key=lambda r: r.key, reverse=True):
        case = r.doc["stages"].get("learner", {}).get("cases", {}).get("dqn CartPole-v1")
        if not case:
            continue
        v = case["variants"]
        cpu = (v.get("cpu_public") or v.get("cpu_1t"))["updates_per_s"]
        g = v["cuda_graph"]["updates_per_s"]
        gpu.append(f"{machines[r.name['machine']]['short']}, {r.name['date']}: {num(g)} updates/s, {g / cpu:.1f}x one CPU thread "
                   f"of its host")
    text = ("hetrl's env steps/s over SB3's / over SBX's, whole runs on the zoo presets, the median of the rounds "
            "(`python benchmarks/bench_sb3.py --libs hetrl,sb3,sbx --rounds 3 --cases ALGO:ENV:STEPS`; Breakout: "
            "`--libs hetrl,sb3 --rounds 2 --cases dqn:ALE/Breakout-v5:25000:learning_starts=5000`; CrossQ: "
            "`--libs hetrl,sbx`, SBX's CrossQ):")
    out = [README_BEGIN, text, "", *L]
    if gpu:
        out += ["", "The DQN CartPole-v1 learner alone replayed as one CUDA graph (`python3 benchmarks/gpu_check.py`): "
                + "; ".join(gpu) + "."]
    return "\n".join(out + [README_END])


def readme(current_text: str, table: str) -> str:
    if README_BEGIN.split(":")[0] not in current_text or README_END not in current_text:
        return current_text
    head, _, rest = current_text.partition(README_BEGIN.split(":")[0])
    _, _, tail = rest.partition(README_END)
    return head + table + tail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 where the pages or files are not in order")
    args = ap.parse_args(argv)
    results, problems = load()
    current, superseded = latest(results)
    problems += [f"{r.path.relative_to(RESULTS)}: superseded by a newer result of the same case and machine; "
                 "remove it (git rm)" for r in superseded]
    text = page(results, current)
    n = text.count("\n")
    if n > MAX_LINES:
        problems.append(f"docs/results.md would hold {n} lines, more than {MAX_LINES}")
    readme_new = readme(README.read_text(), readme_table(results, current))
    if args.check:
        if PAGE.read_text() != text:
            problems.append("docs/results.md is not what benchmarks/results_md.py writes; run it")
        if README.read_text() != readme_new:
            problems.append("README.md's table of figures is not what benchmarks/results_md.py writes; run it")
        for p in problems:
            print(p)
        return 1 if problems else 0
    PAGE.write_text(text)
    README.write_text(readme_new)
    print(f"wrote {PAGE.relative_to(ROOT)} ({n} lines) and README.md's table of figures")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
