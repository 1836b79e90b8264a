"""Profile tables from a few numbers, for the planner's tests (the planner's real ProfileTable, not a mock)."""

from __future__ import annotations

from hetrl.planner.profile import DEFAULT_WIDTHS, FORMAT, ProfileTable


def synthetic_table(*, algo: str = "dqn", env: str = "Synthetic-v0", cores: int = 2, gpus: tuple[str, ...] = (),
                    widths: tuple[int, ...] = DEFAULT_WIDTHS, env_step_s: float = 50e-6,
                    act_overhead_s: float = 30e-6, infer_s: dict | None = None,
                    learn_s: dict | None = None, batch_size: int = 64, rm_s: float = 10e-6,
                    ds_s: dict | None = None, transfer: dict | None = None, power: dict | None = None,
                    bytes_per_transition: int = 64, param_sync_s: float = 0.0) -> ProfileTable:
    """A profile table from a few numbers.

    * env: a vector step of width w costs ``w * env_step_s``; the actor adds ``act_overhead_s``.
    * infer_s: {device: (fixed_s, per_item_s)} (default cpu (40 us, 1 us)).
    * learn_s: {device: seconds per gradient step at ``batch_size``} or {device: {threads: s}};
      the time scales as 0.5 + 0.5 * B / batch_size.
    * rm_s: seconds per replay-manager call (+ 20 ns per item); ds_s: {device: seconds per call}.
    * transfer: {"cpu->cuda:0": (latency_s, bandwidth_Bps), ...}.
    * power: {device: {"idle_w", "busy_w", "source"}} (default: estimated table entries).
    """
    devices = ["cpu"] + [f"cuda:{i}" for i in range(len(gpus))]
    infer_s = infer_s or {"cpu": (40e-6, 1e-6)}
    learn_s = learn_s or {"cpu": 1e-3}
    ds_s = ds_s or {d: 5e-6 for d in devices}
    batches = [max(1, batch_size // 2), batch_size, 2 * batch_size]
    samples = batches + [batch_size * 32]
    inserts = [1, 16, 256]

    def affine(fixed, per, sizes):
        return {str(n): fixed + per * n for n in sizes}

    learn: dict = {}
    for d, v in learn_s.items():
        by_t = v if isinstance(v, dict) else {1: v}
        learn[d] = {str(t): {str(b): s * (0.5 + 0.5 * b / batch_size) for b in batches} for t, s in by_t.items()}
    data = {
        "format": FORMAT, "created": "synthetic",
        "machine": {"hostname": "synthetic", "cpu_model": "synthetic", "cores": cores, "torch": "-",
                    "gpus": list(gpus)},
        "machine_id": "synthetic", "devices": devices,
        "key": {"algo": algo, "env": env, "network": "synthetic", "net_arch": [], "obs_shape": [],
                "action": "", "bytes_per_transition": bytes_per_transition, "batch_size": batch_size},
        "grid": {"widths": list(widths), "batches": batches, "samples": samples, "inserts": inserts},
        "env": {str(w): w * env_step_s for w in widths},
        "act": {str(w): w * env_step_s + act_overhead_s + infer_s.get("cpu", (40e-6, 1e-6))[0]
                + infer_s.get("cpu", (40e-6, 1e-6))[1] * w for w in widths},
        "infer": {d: affine(f, p, widths) for d, (f, p) in infer_s.items()},
        "learn": learn, "learn_grouped": {},
        "ds_insert": {d: affine(s, 2e-9 * bytes_per_transition, inserts) for d, s in ds_s.items()},
        "ds_gather": {d: affine(s, 2e-9 * bytes_per_transition, samples) for d, s in ds_s.items()},
        "rm_insert": {"cpu": affine(rm_s, 20e-9, inserts)},
        "rm_sample": {"cpu": affine(rm_s, 20e-9, samples)},
        "rm_uniform": {"cpu": affine(rm_s / 2, 5e-9, samples)},
        "rm_update": {"cpu": affine(rm_s, 20e-9, samples)},
        "param_sync": {d: param_sync_s for d in devices},
        "transfer": {"cpu->cpu": {"latency_s": 1e-6, "bandwidth_Bps": 5e9},
                     "ipc": {"latency_s": 20e-6, "bandwidth_Bps": 2e9}},
        "power": power or {},
    }
    for key, (lat, bw) in (transfer or {}).items():
        data["transfer"][key] = {"latency_s": lat, "bandwidth_Bps": bw}
    for g in devices[1:]:  # defaults for GPU links not given
        data["transfer"].setdefault(f"cpu->{g}", {"latency_s": 10e-6, "bandwidth_Bps": 10e9})
        data["transfer"].setdefault(f"{g}->cpu", {"latency_s": 10e-6, "bandwidth_Bps": 10e9})
    return ProfileTable(data)


def save_for_this_machine(cfg, table: ProfileTable | None = None, **kw):
    """A synthetic table (synthetic_table(**kw), or `table`) made this machine's profile of `cfg` and saved where
    the planner looks ($HETRL_CACHE_DIR): a run of `cfg` plans from it as a user's second run plans from the
    profile its first one made, with no profiling. Returns the file."""
    from hetrl.planner.profile import cache_path, grid_for, machine_id, machine_info, network_key

    machine = machine_info()
    t = table if table is not None else synthetic_table(algo=cfg.algo, env=cfg.env, **kw)
    t.data.update(machine=machine, machine_id=machine_id(machine), grid=grid_for(cfg, False, machine["cores"]))
    t.data["key"]["network"] = network_key(cfg)
    path = cache_path(cfg, machine)
    t.save(path)
    return path
