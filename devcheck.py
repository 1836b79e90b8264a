"""Device-machine check (not committed): learning of the presets on unloaded CPUs, PPO on CUDA, hetrl vs SB3 speed."""
import json, os, subprocess, sys, time
OUT = os.environ.get("OUT", "/tmp/x/out")
os.makedirs(OUT, exist_ok=True)
SCALE = float(os.environ.get("SCALE", "1"))
T0 = time.time()

def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)

CHILD = r'''
import json, sys, time, torch
torch.set_num_threads(1)
import hetrl
algo, env, steps, seed, extra = sys.argv[1], sys.argv[2], int(float(sys.argv[3])), int(sys.argv[4]), json.loads(sys.argv[5])
t = time.time()
run = hetrl.train(algo, env, steps=steps, seed=seed, plan="none", progress=False, threads=1, **extra)
r = run.result
print(json.dumps({"algo": algo, "env": env, "seed": seed, "eval": r.get("eval_return_mean"), "final": r.get("final_eval_return_mean"),
                  "env_steps": r["env_steps"], "sps": r["env_steps_per_s"], "wall": r["wall_s"], "total_s": time.time() - t,
                  "kernel": r.get("learner_kernel"), "device": r.get("device"), "evals": r.get("evaluations")}))
'''

def spawn(algo, env, steps, seed, extra=None):
    return subprocess.Popen([sys.executable, "-c", CHILD, algo, env, str(int(steps * SCALE)), str(seed), json.dumps(extra or {})],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

log("torch", __import__("torch").__version__, "cuda", __import__("torch").cuda.is_available(), os.cpu_count(), "cpus")
jobs = [("ppo", "CartPole-v1", 1e5, s) for s in range(3)] + [("ppo", "Pendulum-v1", 1e5, s) for s in range(3)] + \
       [("a2c", "CartPole-v1", 1e5, s) for s in range(3)]
procs = [(j, spawn(*j)) for j in jobs]
gpu = None
import torch
if torch.cuda.is_available():
    gpu = spawn("ppo", "CartPole-v1", 2e4, 0, {"device": "cuda", "learner_kernel": "auto", "eval_episodes": 2})
results = []
for j, p in procs + ([(("ppo-cuda",), gpu)] if gpu else []):
    try:
        out, err = p.communicate(timeout=max(5, 200 - (time.time() - T0)))
    except subprocess.TimeoutExpired:
        p.kill(); out, err = p.communicate()
        log("TIMEOUT", j)
    line = out.strip().splitlines()[-1] if out.strip() else ""
    try:
        res = json.loads(line)
    except Exception:
        res = {"job": list(j), "error": err[-1500:]}
    results.append(res)
    log(json.dumps({k: v for k, v in res.items() if k != "evals"})[:400])
    json.dump(results, open(f"{OUT}/learning.json", "w"), indent=1)

# speed: hetrl and SB3's PPO on the CartPole preset, alternating, one thread each
BENCH = r'''
import json, sys, time, torch
torch.set_num_threads(1)
sys.path.insert(0, "benchmarks")
lib, steps = sys.argv[1], int(float(sys.argv[2]))
from hetrl.config import make_config
cfg = make_config("ppo", "CartPole-v1", {"steps": steps})
if lib == "hetrl":
    import hetrl
    r = hetrl.train("ppo", "CartPole-v1", steps=steps, plan="none", progress=False, threads=1, eval_episodes=0).result
    print(json.dumps({"lib": lib, "sps": r["env_steps_per_s"], "wall": r["wall_s"], "learner_s": r["learner_busy_s"], "acting_s": r["acting_s"]}))
else:
    from sb3_preset import sb3_model
    m = sb3_model(cfg, "CartPole-v1", device="cpu")
    t = time.perf_counter(); m.learn(steps); w = time.perf_counter() - t
    print(json.dumps({"lib": lib, "sps": m.num_timesteps / w, "wall": w}))
'''
speed = []
for r in range(2):
    for lib in (("hetrl", "sb3") if r % 2 == 0 else ("sb3", "hetrl")):
        if time.time() - T0 > 300:
            break
        p = subprocess.run([sys.executable, "-c", BENCH, lib, str(1e5 * SCALE)], capture_output=True, text=True, timeout=120)
        try:
            speed.append(json.loads(p.stdout.strip().splitlines()[-1]))
        except Exception:
            speed.append({"lib": lib, "error": p.stderr[-1500:]})
        log("speed", speed[-1])
        json.dump(speed, open(f"{OUT}/speed.json", "w"), indent=1)
log("done")
