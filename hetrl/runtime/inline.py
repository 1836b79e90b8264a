"""The inline schedule: every part in one process, alternating, deterministic under a seed.

It is the reference realisation of the training protocol:
    actor --collect--> insert --> replay --sample--> learner --|TD|--> priorities --> replay
    learner --publish--> parameter store --latest--> actor
One *phase* = `train_freq` env steps of acting, then replay_ratio x that many gradient steps.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from hetrl.actors import Actor, probe_spaces
from hetrl.actors.envs import EnvSpec
from hetrl.algos import make_algorithm, replay_spec
from hetrl.config import Config
from hetrl.errors import UsageError
from hetrl.replay import ReplayBuffer
from hetrl.runtime.params import ParameterStore


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"device={name} asked but CUDA is not available (torch {torch.__version__}); "
                             "install a CUDA build of torch (see README) or use --set device=cpu")
        idx = torch.device(name).index or 0
        if idx >= torch.cuda.device_count():
            raise UsageError(f"device={name} does not exist: {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device(name)


@dataclass
class Counters:
    env_steps: int = 0
    gradient_steps: int = 0
    phases: int = 0
    wall_s: float = 0.0
    acting_s: float = 0.0
    learner_s: float = 0.0       # learner busy: gradient computation and optimizer steps
    replay_s: float = 0.0        # replay manager busy: insert, sample, priority update
    grad_debt: float = 0.0       # fractional gradient steps owed by the replay ratio


class InlineSchedule:
    name = "inline"

    def __init__(self, cfg: Config, env: EnvSpec):
        self.cfg, self.env = cfg, env
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.threads or os.cpu_count() or 1)
        # Adam's moments of parameters whose gradients went to zero (dead ReLUs) decay into
        # denormal floats, which make CPU arithmetic ~5x slower: flush them to zero.
        torch.set_flush_denormal(True)
        self.device = resolve_device(cfg.device)
        self.obs_space, self.act_space = probe_spaces(env)
        self.algo = make_algorithm(cfg, self.obs_space, self.act_space, self.device)
        self.replay = ReplayBuffer(cfg.buffer_size, replay_spec(self.obs_space, self.act_space), self.device,
                                   prioritized=cfg.prioritized, alpha=cfg.per_alpha, beta=cfg.per_beta,
                                   seed=cfg.seed)
        self.params = ParameterStore()
        self.params.publish(self.algo.policy_state())
        self.actor = Actor(env, cfg.num_envs, cfg.seed, self.algo.make_policy(seed=cfg.seed + 1),
                           cfg.n_step, cfg.gamma, cfg.env_backend)
        self.c = Counters()

    # ---- the protocol, one phase ---------------------------------------------------------
    def phase(self) -> list[tuple[float, int]]:
        cfg, c = self.cfg, self.c
        t0 = time.perf_counter()
        before = self.actor.env_steps
        batch = self.actor.collect(min(cfg.train_freq, cfg.steps - before), self.algo.exploration)
        t1 = time.perf_counter()
        if batch is not None:
            self.replay.insert(batch)
        self.algo.on_env_steps(before, self.actor.env_steps)
        c.env_steps = self.actor.env_steps
        t2 = time.perf_counter()
        c.acting_s += t1 - t0
        c.replay_s += t2 - t1
        if c.env_steps >= cfg.learning_starts and len(self.replay) >= cfg.batch_size:
            ratio = cfg.replay_ratio if cfg.gradient_steps > 0 else 1.0
            c.grad_debt += (c.env_steps - before) * ratio
            n = int(c.grad_debt)
            c.grad_debt -= n
            if n:
                self.learn(n)
                c.phases += 1
                if c.phases % cfg.publish_interval == 0:
                    self.params.publish(self.algo.policy_state())
        new = self.params.latest(self.actor.params_version)
        if new is not None:
            self.actor.load(*new)
        return self.actor.drain_episodes()

    def learn(self, n: int) -> None:
        """n gradient steps. Uniform replay: all n batches in one gather (the buffer does not change
        during a phase, so this is the same distribution). Prioritised: sample -> learn -> update
        priorities one batch at a time, so every sample sees the newest priorities."""
        cfg, c, B = self.cfg, self.c, self.cfg.batch_size
        if cfg.prioritized:
            frac = min(1.0, c.env_steps / cfg.steps)
            self.replay.set_beta(cfg.per_beta + frac * (1.0 - cfg.per_beta))
        groups = [n] if not cfg.prioritized else [1] * n
        for k in groups:
            t0 = time.perf_counter()
            batch, keys, weights = self.replay.sample(k * B)
            stack = {name: v.view(k, B, *v.shape[1:]) for name, v in batch.items()}
            t1 = time.perf_counter()
            td = self.algo.learn(stack, weights.view(k, B))
            t2 = time.perf_counter()
            if cfg.prioritized:
                self.replay.update_priorities(keys, td.view(-1))
            c.replay_s += (t1 - t0) + (time.perf_counter() - t2)
            c.learner_s += t2 - t1
            c.gradient_steps += k

    def done(self) -> bool:
        return self.c.env_steps >= self.cfg.steps

    # ---- figures and state -----------------------------------------------------------------
    def figures(self) -> dict:
        c, B = self.c, self.cfg.batch_size
        return {"env_steps": c.env_steps, "gradient_steps": c.gradient_steps, "wall_s": c.wall_s,
                "env_steps_per_s": c.env_steps / c.wall_s if c.wall_s else 0.0,
                "train_samples_per_s": B * c.gradient_steps / c.learner_s if c.learner_s else 0.0,
                "learner_busy_s": c.learner_s, "acting_s": c.acting_s, "replay_busy_s": c.replay_s,
                "replay_ratio_achieved": c.gradient_steps / c.env_steps if c.env_steps else 0.0,
                "params_version": self.params.version}

    def state_dict(self, with_replay: bool) -> dict:
        state = {"algo": self.algo.state_dict(), "counters": asdict(self.c),
                 "actor_env_steps": self.actor.env_steps,
                 "policy_rng": self.actor.policy.rng.bit_generator.state,
                 "torch_rng": torch.get_rng_state()}
        if with_replay:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.algo.load_state_dict(state["algo"])
        self.c = Counters(**state["counters"])
        self.actor.env_steps = int(state["actor_env_steps"])
        self.actor.policy.rng.bit_generator.state = state["policy_rng"]
        torch.set_rng_state(state["torch_rng"])
        if "replay" in state:
            self.replay.load_state_dict(state["replay"])
        # envs cannot be checkpointed: they restart with seeds derived from the step count
        self.actor.obs, _ = self.actor.venv.reset(
            seed=[self.cfg.seed + self.c.env_steps + i for i in range(self.cfg.num_envs)])
        self.params.publish(self.algo.policy_state())
        self.actor.load(*self.params.latest(-1))

    def close(self) -> None:
        self.actor.close()
