"""The planner's model and search on synthetic profile tables (deterministic, no timing)."""

import json

import pytest

from hetrl.config import Config, make_config
from hetrl.errors import UsageError
from hetrl.planner import Plan, Workload, plan, predict
from hetrl.planner.search import SCHEMA, parse_pins, search
from synthetic_profiles import synthetic_table

BOTH = ("inline", "local")
# CartPole-like workload: 0.5 gradient steps per env step, batches of 64
WORK = Workload(replay_ratio=0.5, batch_size=64, train_freq=256, grads_per_phase=128)


def best(table, work=WORK, **kw):
    kw.setdefault("schedules", BOTH)
    kw.setdefault("cores", 4)
    return search(table, work, **kw)


def test_slow_env_gets_more_actors():
    fast = best(synthetic_table(env_step_s=20e-6, learn_s={"cpu": 1e-3}))
    slow = best(synthetic_table(env_step_s=2e-3, learn_s={"cpu": 1e-3}))
    assert slow.plan.schedule == "local"
    assert slow.plan.actors > fast.plan.actors
    assert slow.plan.actors >= 2


def test_slow_learner_is_the_bottleneck():
    r = best(synthetic_table(env_step_s=20e-6, learn_s={"cpu": 20e-3}))
    assert r.bottleneck.startswith("learner-bound")
    r = best(synthetic_table(env_step_s=20e-6, learn_s={"cpu": 20e-3}), schedules=("local",))
    assert r.prediction.bound == "learner"
    assert "more actors would not help" in r.bottleneck


def test_slow_env_with_one_actor_is_actor_bound():
    r = best(synthetic_table(env_step_s=2e-3, learn_s={"cpu": 1e-3}), pins={"schedule": "local", "actors": 1})
    assert r.prediction.bound == "actors"
    assert r.bottleneck.startswith("actor-bound")


def test_rate_limiter_caps_at_the_slower_side():
    t = synthetic_table(env_step_s=100e-6, learn_s={"cpu": 1e-3})
    p = predict(Plan("local", 2, 4, threads=1), t, WORK, cores=8)
    assert p.env_steps_per_s == pytest.approx(min(p.limits.values()))
    assert p.gradient_steps_per_s == pytest.approx(p.env_steps_per_s * WORK.replay_ratio)
    assert p.train_samples_per_s == pytest.approx(p.gradient_steps_per_s * 64)
    # a higher replay ratio moves the bound to the learner and lowers env steps/s
    heavy = predict(Plan("local", 2, 4, threads=1), t, Workload(4.0, 64, train_freq=4, grads_per_phase=16), cores=8)
    assert heavy.bound == "learner" and heavy.env_steps_per_s < p.env_steps_per_s


def test_core_contention_is_modelled():
    t = synthetic_table(env_step_s=1e-3, learn_s={"cpu": 0.2e-3})
    few = predict(Plan("local", 2, 4, threads=1), t, WORK, cores=2)
    many = predict(Plan("local", 6, 4, threads=1), t, WORK, cores=2)
    assert many.limits["actors"] > few.limits["actors"]         # more actors could act more ...
    assert many.env_steps_per_s <= few.env_steps_per_s * 1.01   # ... but the 2 cores are already used
    assert many.bound == "cpu"
    assert many.busy["cpu"] <= 1.0


def test_threaded_learner_on_cores_that_busy_actors_share_is_slowed():
    # 2 cores, 1 actor + a 2-thread learner: the learner's threads share a core with the actor
    learn = {"cpu": {1: 1e-3, 2: 0.7e-3}}
    idle_actor = synthetic_table(env_step_s=1e-6, learn_s=learn)      # the actor is rarely busy
    busy_actor = synthetic_table(env_step_s=1e-3, learn_s=learn)      # the actor keeps its core busy
    for t, w, slowed in ((idle_actor, 16, False), (busy_actor, 1, True)):
        two = predict(Plan("local", 1, w, threads=2), t, WORK, cores=2)
        alone = t.learn_step("cpu", 64, 2, 32)
        assert (two.times["learn"] > 1.2 * alone) == slowed
    own_core = predict(Plan("local", 1, 1, threads=1), busy_actor, WORK, cores=2)
    assert own_core.times["learn"] == busy_actor.learn_step("cpu", 64, 1, 32)   # no sharing, no penalty


def test_gpu_takes_the_learner_when_faster_including_transfers():
    t = synthetic_table(gpus=("Synthetic GPU",), learn_s={"cpu": 2e-3, "cuda:0": 0.3e-3},
                        infer_s={"cpu": (40e-6, 1e-6), "cuda:0": (60e-6, 0.1e-6)},
                        transfer={"cpu->cuda:0": (10e-6, 10e9), "cuda:0->cpu": (10e-6, 10e9)})
    r = best(t)
    assert r.plan.learner_device == "cuda:0"
    assert r.plan.storage_device == "cuda:0"   # this build keeps learner and data storage on one device
    assert "cuda:0" in r.prediction.busy


def test_gpu_keeps_off_the_learner_when_transfers_make_it_slower():
    slow_link = {"cpu->cuda:0": (1e-3, 1e5), "cuda:0->cpu": (1e-3, 1e5)}
    t = synthetic_table(gpus=("Synthetic GPU",), learn_s={"cpu": 2e-3, "cuda:0": 0.3e-3}, transfer=slow_link)
    for placement in ("runnable", "all"):
        r = best(t, placement=placement)
        assert r.plan.learner_device == "cpu", placement
    # the GPU plan is priced with its transfers: slower than the CPU plan
    gpu = predict(Plan("inline", 1, 8, "cuda:0", "cpu", "cpu", "cpu", 64, 1), t, WORK, cores=4)
    cpu = predict(Plan("inline", 1, 8, "cpu", "cpu", "cpu", "cpu", 64, 1), t, WORK, cores=4)
    assert gpu.times["transfer_per_grad"] > 0
    assert gpu.env_steps_per_s < cpu.env_steps_per_s


def test_storage_on_gpu_makes_inserts_cross():
    t = synthetic_table(gpus=("G",), learn_s={"cpu": 1e-3, "cuda:0": 1e-3})
    on_cpu = predict(Plan("local", 1, 8, "cpu", "cpu"), t, WORK, cores=4)
    on_gpu = predict(Plan("local", 1, 8, "cpu", "cuda:0"), t, WORK, cores=4)
    assert on_gpu.times["insert_per_step"] > on_cpu.times["insert_per_step"]
    assert on_gpu.times["transfer_per_grad"] > 0 == on_cpu.times["transfer_per_grad"]


def test_efficiency_prefers_fewer_watts_per_step():
    power = {"cpu": {"idle_w": 10.0, "busy_w": 5.0, "source": "estimated"},
             "cuda:0": {"idle_w": 60.0, "busy_w": 400.0, "source": "estimated"}}
    t = synthetic_table(gpus=("Big GPU",), learn_s={"cpu": 1e-3, "cuda:0": 0.7e-3}, power=power)
    fast = best(t, objective="throughput")
    green = best(t, objective="efficiency")
    assert fast.plan.learner_device == "cuda:0"
    assert green.plan.learner_device == "cpu"
    assert green.steps_per_joule > fast.steps_per_joule
    assert fast.predicted_env_steps_per_s >= green.predicted_env_steps_per_s
    assert green.watts / green.predicted_env_steps_per_s < fast.watts / fast.predicted_env_steps_per_s


def test_power_is_labelled_estimated():
    r = best(synthetic_table())
    assert r.power_source == "estimated"
    assert any("estimated" in n for n in r.notes)
    measured = {"cpu": {"idle_w": 10.0, "busy_w": 5.0, "source": "rapl"}}
    assert best(synthetic_table(power=measured)).power_source == "measured"


def test_pins_are_respected():
    t = synthetic_table(gpus=("G",), env_step_s=2e-3, learn_s={"cpu": 2e-3, "cuda:0": 0.2e-3})
    r = best(t, pins={"actors": 2, "learner_device": "cpu"})
    for pred in [r.prediction] + r.runners_up:
        assert pred.plan.actors == 2 and pred.plan.learner_device == "cpu" and pred.plan.schedule == "local"
    r = best(t, pins=parse_pins(["envs_per_actor=3", "schedule=inline", "threads=1"]))
    assert (r.plan.envs_per_actor, r.plan.schedule, r.plan.threads) == (3, "inline", 1)
    r = best(t, pins={"device": "cuda"})
    assert r.plan.learner_device == r.plan.storage_device == "cuda:0"


@pytest.mark.parametrize("pins, words", [
    ({"actor": 2}, "did you mean 'actors'"),
    ({"actors": "two"}, "not an integer"),
    ({"actors": 0}, ">= 1"),
    ({"learner_device": "cuda:3"}, "has no cuda:3"),
    ({"learner_device": "tpu"}, "not a device"),
    ({"schedule": "ray"}, "not plannable"),
    ({"schedule": "inline", "actors": 3}, "needs schedule=local"),
    ({"storage_device": "cpu", "learner_device": "cuda:0"}, "data storage on cpu apart from the learner"),
    ({"replay_device": "cuda:0"}, "replay manager on cuda:0 .* this runtime cannot run"),
    ({"actor_inference_device": "cuda:0"}, "actor inference on cuda:0 .* this runtime cannot run"),
    ({"batch_size": 128}, "batch_size is the preset's"),
    ({"num_envs": 4}, "num_envs is the preset's"),
])
def test_bad_pins_are_usage_errors(pins, words):
    t = synthetic_table(gpus=("G",))
    with pytest.raises(UsageError, match=words):
        best(t, pins=pins)


def test_bad_objective_is_a_usage_error():
    with pytest.raises(UsageError, match="objective"):
        best(synthetic_table(), objective="speed")


def test_plan_json_schema():
    cfg = make_config("dqn", "CartPole-v1")
    r = plan(cfg, profile=synthetic_table(env="CartPole-v1"), schedules=BOTH, cores=4)
    doc = json.loads(json.dumps(r.to_json()))
    assert doc["schema"] == SCHEMA
    for key in ("algo", "env", "objective", "cores", "replay_ratio", "plan", "settings", "predicted",
                "bottleneck", "runners_up", "pins", "notes", "candidates", "profile"):
        assert key in doc, key
    assert set(doc["plan"]) == {"schedule", "actors", "envs_per_actor", "learner_device", "storage_device",
                                "replay_device", "actor_inference_device", "batch_size", "threads", "runnable"}
    assert doc["plan"]["runnable"] is True
    assert doc["objective_meaning"].startswith("env steps/s at the preset's settings")
    assert doc["preset_envs"] == 1 and doc["learning_changes"] == {}
    pred = doc["predicted"]
    for key in ("env_steps_per_s", "train_samples_per_s", "gradient_steps_per_s", "busy", "watts",
                "steps_per_joule", "power_source", "bound", "limits", "times_s"):
        assert key in pred, key
    assert pred["env_steps_per_s"] > 0 and 0 < pred["busy"]["cpu"] <= 1
    assert doc["runners_up"] and {"plan", "predicted"} <= set(doc["runners_up"][0])
    assert isinstance(doc["bottleneck"], str) and doc["bottleneck"]
    # the settings are Config overrides that make a valid config
    fields = set(Config().to_dict())
    assert set(doc["settings"]) <= fields
    assert {"schedule", "device", "num_envs", "threads"} <= set(doc["settings"])
    make_config("dqn", "CartPole-v1", doc["settings"])


def test_settings_of_a_local_plan():
    s = Plan("local", 3, 4, threads=1).settings()
    assert s["schedule"] == "local" and s["actors"] == 3 and s["envs_per_actor"] == 4 and s["num_envs"] == 12
    assert "actors" not in Plan("inline", 1, 8).settings()


def test_settings_are_only_config_system_keys_and_the_env_count():
    from hetrl.config import SYSTEM_KEYS

    fields = set(Config().to_dict())
    for plan_ in (Plan("local", 2, 4, "cuda:0", "cpu", "cuda:0", "cuda:0", 256, 1), Plan("inline", 1, 8)):
        s = plan_.settings()
        assert set(s) <= fields                                   # no phantom placement keys
        assert set(s) - {"num_envs"} <= set(SYSTEM_KEYS)          # batch_size is never a plan's
        assert s["num_envs"] == plan_.num_envs


def test_runnable_placement_keeps_replay_and_inference_on_cpu():
    t = synthetic_table(gpus=("G",), learn_s={"cpu": 1e-3, "cuda:0": 0.2e-3},
                        infer_s={"cpu": (40e-6, 1e-6), "cuda:0": (1e-6, 0.0)})
    r = best(t)
    assert r.plan.actor_inference_device == "cpu" and r.plan.replay_device == "cpu"
    assert r.plan.runnable and all(q.plan.runnable for q in r.runners_up)
    r_all = best(t, placement="all")
    assert r_all.plan.actor_inference_device == "cuda:0"   # cheaper inference: modelled, not runnable
    assert r_all.candidates > r.candidates
    assert not r_all.plan.runnable and any(n.startswith("modelled, not runnable") for n in r_all.notes)
    with pytest.raises(UsageError, match="modelled, not runnable"):
        r_all.apply(make_config("dqn", "CartPole-v1"))


def test_pins_from_hand_set_settings_and_apply():
    from hetrl.planner import pins_from_settings

    assert pins_from_settings({"device": "cpu", "threads": 0, "lr": 1e-3}) == \
        {"learner_device": "cpu", "storage_device": "cpu"}
    # num_envs is the preset's (or the user's) setting, kept through the workload: never a pin
    assert pins_from_settings({"schedule": "inline", "num_envs": 4, "batch_size": 32}) == {"schedule": "inline"}
    assert pins_from_settings({"schedule": "local", "actors": "3"}) == {"schedule": "local", "actors": 3}
    cfg = make_config("dqn", "CartPole-v1", {"lr": 1e-3, "num_envs": 4})
    r = plan(cfg, profile=synthetic_table(env="CartPole-v1", env_step_s=2e-3), schedules=BOTH, cores=4,
             pins=pins_from_settings({"actors": 2}))
    new = r.apply(cfg)
    assert (new.system.schedule, new.system.actors, new.system.envs_per_actor, new.num_envs, new.lr) == ("local", 2, 2, 4, 1e-3)


def test_fewer_cores_on_a_shared_machine():
    t = synthetic_table(env_step_s=200e-6, learn_s={"cpu": 1e-3})
    p = Plan("local", 2, 4, threads=1)
    whole = predict(p, t, WORK, cores=2)
    part = predict(p, t, WORK, cores=0.75)
    assert part.env_steps_per_s < whole.env_steps_per_s and part.bound == "cpu"
    inline = predict(Plan("inline", 1, 4), t, WORK, cores=2)
    inline_part = predict(Plan("inline", 1, 4), t, WORK, cores=0.5)
    assert inline_part.env_steps_per_s == pytest.approx(
        min(inline.env_steps_per_s, 0.5 / (inline.times["act_per_step"] + inline.times["main_cpu_per_step"])))
    r = best(t, cores=1.5)
    assert r.cores == 1.5 and any("1.5 cores" in n for n in r.notes)
    with pytest.raises(UsageError, match="cores"):
        best(t, cores=-1)


def test_available_cores_probe():
    from hetrl.planner.load import available_cores

    n = available_cores(seconds=0.05, n=1)
    assert 0 < n <= 1


def test_pinning_a_part_where_it_was_not_profiled():
    t = synthetic_table(gpus=("G",))   # the sum tree is profiled on the CPU only
    with pytest.raises(UsageError, match="no replay manager measurements on cuda:0"):
        best(t, pins={"replay_device": "cuda:0"}, placement="all")


def test_prefetch_is_priced_and_planned_as_the_profile_measured_it():
    """Local schedule: the prefetch thread overlaps sampling with learning only where the profile measured
    its learner loop faster with it; otherwise the model prices the draw in line and the plan turns it off.
    Prioritized replay prefetches only where the priority lag leaves room (exact PER never does), and a CPU
    learner's thread only where the actors and the learner's threads leave it a core."""
    import dataclasses

    from hetrl.planner.profile import prefetch_key

    per = dataclasses.replace(WORK, prioritized=True, priority_lag=1)
    plan_ = Plan("local", 1, 1, threads=1)
    in_line = predict(plan_, synthetic_table(), dataclasses.replace(per, prefetch=False), cores=3)
    unmeasured = predict(plan_, synthetic_table(), per, cores=3)           # no figure: the runtime's default, on
    assert unmeasured.times["main_per_grad"] < in_line.times["main_per_grad"]
    exact = dataclasses.replace(per, priority_lag=0)
    assert predict(plan_, synthetic_table(), exact, cores=3).times["main_per_grad"] == \
        pytest.approx(predict(plan_, synthetic_table(), dataclasses.replace(exact, prefetch=False), cores=3)
                      .times["main_per_grad"])
    assert search(synthetic_table(), exact, pins={"schedule": "local", "actors": 1, "threads": 1}, cores=3).prefetch is False
    for pays in (False, True):
        t = synthetic_table()
        t.data["prefetch"] = {prefetch_key(True, 1): {"group": 1, "serial_s": 5e-4, "prefetch_s": 5.4e-4 if not pays
                                                      else 4.6e-4, "chosen": pays}}
        got = predict(plan_, t, per, cores=3)
        want = unmeasured if pays else in_line
        assert got.times["main_per_grad"] == pytest.approx(want.times["main_per_grad"])
        r = search(t, per, pins={"schedule": "local", "actors": 1, "threads": 1}, cores=3)
        assert r.prefetch is pays and r.profile["prefetch"]["chosen"] is pays
        assert search(t, dataclasses.replace(per, prefetch=False), pins={"schedule": "local"}, cores=3).prefetch is False
        busy = search(t, per, pins={"schedule": "local", "actors": 1, "threads": 1}, cores=2)   # no core left
        assert busy.prefetch is False and busy.profile["prefetch"]["no_core"] is pays
        assert predict(plan_, t, per, cores=2).times["main_per_grad"] == pytest.approx(
            predict(plan_, t, dataclasses.replace(per, prefetch=False), cores=2).times["main_per_grad"])
    # the uniform loop's figure is another entry: a prioritized one does not decide it
    assert t.prefetch_pays("cpu", False, 32) and not synthetic_table().prefetch("cpu", True, 1)


def test_the_loop_the_profile_timed_whole_is_priced_beyond_its_parts():
    """What the real inline loop measured per env step beyond the model's parts (profile/loop.py) is added to an
    inline plan whole, and to a local plan less its acting (a local actor acts in a process of its own); an entry
    measured under load, a GPU learner and an on-policy workload add nothing."""
    import dataclasses

    t = synthetic_table(cores=4)
    inline, local = Plan("inline", 1, 4, threads=1), Plan("local", 1, 4, threads=1)
    before = {p.schedule: predict(p, t, WORK, cores=4) for p in (inline, local)}
    assert before["inline"].times["loop_excess_per_step"] == 0.0
    parts = before["inline"].times
    side = parts["insert_per_step"] + WORK.replay_ratio * (parts["sample"] + parts["update_priorities"]
                                                           + parts["param_sync"])
    rest, act = parts["act_per_step"] + side + 400e-6, parts["act_per_step"] + 150e-6
    t.data["loop"] = {"cpu": {"1": {"s": rest, "act_s": act, "envs": 4}}}
    got = predict(inline, t, WORK, cores=4)
    assert got.times["loop_excess_per_step"] == pytest.approx(400e-6)
    assert 1 / got.env_steps_per_s == pytest.approx(1 / before["inline"].env_steps_per_s + 400e-6)
    assert predict(local, t, WORK, cores=4).times["loop_excess_per_step"] == pytest.approx(250e-6)
    assert predict(Plan("inline", 1, 4, threads=2), t, WORK, cores=4).times["loop_excess_per_step"] == \
        pytest.approx(400e-6)   # the nearest thread count measured quiet
    assert predict(inline, t, dataclasses.replace(WORK, rollout=True), cores=4).times["loop_excess_per_step"] == 0
    # the loop's own updates price a plan at exactly its thread count and about its steps per call, nothing else
    t.data["loop"]["cpu"]["1"].update(learn_s=5e-3, group=WORK.grads_per_phase, threads=1)
    assert predict(inline, t, WORK, cores=4).times["learn"] == pytest.approx(5e-3)
    # a local plan's (32 steps a call, the loop's 128) moved by the learner entries' ratio between the two groups
    ratio = t.learn_step("cpu", 64, 1, 32, calibrated=False) / t.learn_step("cpu", 64, 1, 128, calibrated=False)
    assert predict(local, t, WORK, cores=4).times["learn"] == pytest.approx(5e-3 * ratio)
    assert predict(Plan("inline", 1, 4, threads=2), t, WORK, cores=4).times["learn"] != pytest.approx(5e-3)
    t.data["loop"]["cpu"]["1"]["provisional"] = "measured under load"
    assert predict(inline, t, WORK, cores=4).times["loop_excess_per_step"] == 0.0
    gpu = synthetic_table(gpus=("gpu",), learn_s={"cpu": 1e-3, "cuda:0": 1e-4})
    gpu.data["loop"] = {"cpu": {"1": {"s": 1.0, "act_s": 0.0, "envs": 4}}}
    assert predict(Plan("inline", 1, 4, learner_device="cuda:0", storage_device="cuda:0"), gpu, WORK,
                   cores=4).times["loop_excess_per_step"] == 0.0
