"""Atari (ALE) preprocessing: Stable-Baselines3's `AtariWrapper` + `VecFrameStack(4)`, from
Gymnasium's own wrappers where they exist.

For every ALE id (`ALE/*-v5`, `*NoFrameskip-v4`; see `hetrl.config.atari_id`) hetrl builds

    gymnasium.make(id, frameskip=1[, repeat_action_probability=p])   # sticky actions: the id's default
    AtariPreprocessing(noop_max=30, frame_skip=4, screen_size=84)    # noop reset, skip 4 with a max over
                                             # the last 2 frames, 84x84 grayscale (terminal_on_life_loss off)
    RecordEpisodeStatistics                  # whole games: the raw score and length, for the training log
    AtariLives(episodic=train, fire=...)     # SB3's EpisodicLifeEnv + FireResetEnv (below)
    TransformReward(np.sign)                 # training only: rewards clipped to -1, 0, 1
    FrameStackObservation(4, padding="zero") # in envs.py, for any env (SB3's VecFrameStack pads with zeros)

Every part has a switch (AtariOptions: cfg.atari, set as atari_*; frame_stack). An evaluation env is the training env without
the reward clipping and with whole games as episodes: a lost life does not end the episode, the game
goes on after the same no-op and FIRE steps that training's reset takes (as SB3's evaluation, whose
Monitor reports the raw score of the game played through the training wrappers).

Why not `AtariPreprocessing(terminal_on_life_loss=True)`: it ends the episode at a lost life and the
next `reset()` restarts the whole game, so an agent would never play past its first life. SB3's
EpisodicLifeEnv (and DeepMind's) ends the episode but continues the game at the next reset; AtariLives
does the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from hetrl.errors import UsageError


def atari_id(env: str) -> bool:
    """Whether `env` names an Atari game of the ALE with screen observations (ALE/Pong-v5,
    PongNoFrameskip-v4; not the -ram ids): hetrl preprocesses them (this module) and gives them the
    `atari` preset."""
    base_id = env.split(":")[-1]
    return (base_id.startswith("ALE/") or base_id.endswith("NoFrameskip-v4")) and "-ram" not in base_id


@dataclass(frozen=True)
class AtariOptions:
    """The preprocessing switches: a run's `cfg.atari` (its flat keys are atari_ + the field's name:
    --set atari_noop_max=0); used for ALE ids only; picklable."""

    noop_max: int = 30                  # up to this many no-op steps at reset (0: none)
    frame_skip: int = 4                 # agent steps every K frames, max-pooling the last 2 (1: no skip)
    screen_size: int = 84               # frames resized to NxN grayscale
    episodic_life: bool = True          # training: a lost life ends the episode (the game goes on)
    fire_reset: bool = True             # press FIRE after a reset, in games that wait for it
    clip_reward: bool = True            # training: rewards clipped to their sign (evaluation: the raw score)
    sticky_actions: str = "auto"        # repeat_action_probability: auto = the id's default (0.25 for v5), or a number

    @property
    def repeat_action_probability(self) -> float | None:
        """ALE's repeat_action_probability; None: the id's own default (0.25 for v5 ids)."""
        return None if self.sticky_actions == "auto" else float(self.sticky_actions)

    def validate(self) -> None:
        """The switches' own checks (UsageError naming the setting by its flat key)."""
        for name in ("frame_skip", "screen_size"):
            if getattr(self, name) <= 0:
                raise UsageError(f"atari_{name} must be positive, got {getattr(self, name)}")
        if self.noop_max < 0:
            raise UsageError(f"atari_noop_max must be >= 0, got {self.noop_max}")
        p = self.sticky_actions
        try:
            ok = p == "auto" or 0.0 <= float(p) <= 1.0
        except ValueError:
            ok = False
        if not ok:
            raise UsageError(f"atari_sticky_actions={p!r} is not auto or a number in [0, 1]; "
                             "e.g. --set atari_sticky_actions=0.25")


def register() -> None:
    """Make the ALE ids known to Gymnasium; UsageError naming the extra when ale-py is missing."""
    try:
        import ale_py
    except ImportError:
        raise UsageError("Atari envs need ale-py, which is not installed; pip install 'hetrl[atari]' "
                         "(pip install -e '.[atari]' in a checkout)") from None
    gym.register_envs(ale_py)


def base_kwargs(opts: AtariOptions) -> dict:
    """gymnasium.make keyword arguments of the ALE env under the preprocessing."""
    kw = {"frameskip": 1}   # AtariPreprocessing skips (and max-pools) itself
    if opts.repeat_action_probability is not None:
        kw["repeat_action_probability"] = opts.repeat_action_probability
    return kw


def wrap(env: gym.Env, opts: AtariOptions, train: bool) -> gym.Env:
    """The preprocessing of an ALE env made with base_kwargs (frame stacking excluded)."""
    try:
        env = gym.wrappers.AtariPreprocessing(env, noop_max=opts.noop_max, frame_skip=opts.frame_skip,
                                              screen_size=opts.screen_size, terminal_on_life_loss=False,
                                              grayscale_obs=True)
    except gym.error.DependencyNotInstalled:
        raise UsageError("Atari preprocessing needs OpenCV, which is not installed; pip install 'hetrl[atari]' "
                         "(pip install -e '.[atari]' in a checkout)") from None
    env = gym.wrappers.RecordEpisodeStatistics(env)   # whole games: raw score, agent steps
    fire = opts.fire_reset and needs_fire(env)
    if opts.episodic_life or fire:
        env = AtariLives(env, episodic=opts.episodic_life and train, fire=fire,
                         whole_games=opts.episodic_life and not train)
    if opts.clip_reward and train:
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(r)))
    return env


def needs_fire(env: gym.Env) -> bool:
    """Whether the game waits for FIRE (SB3's FireResetEnv test: action 1 is FIRE, 3 actions or more)."""
    meanings = env.unwrapped.get_action_meanings()
    return len(meanings) >= 3 and meanings[1] == "FIRE"


class AtariLives(gym.Wrapper):
    """Lives and FIRE, as SB3's EpisodicLifeEnv and FireResetEnv (one wrapper, so evaluation can
    take the same steps without ending its episode).

    episodic: a lost life ends the episode (terminated); the next reset() continues the same game
        with a no-op step (a real reset only after the game is over), as EpisodicLifeEnv.
    fire: every reset (a continued game too) presses FIRE, then action 2, as FireResetEnv, for
        games that wait for FIRE to start (Breakout).
    whole_games: evaluation: a lost life does not end the episode; the game goes on at once after the
        steps training's reset would take (the no-op, FIRE), their rewards counted.
    """

    def __init__(self, env: gym.Env, episodic: bool, fire: bool, whole_games: bool = False):
        super().__init__(env)
        self.episodic, self.fire, self.whole_games = episodic, fire, whole_games
        self.lives = 0
        self.real_done = True

    def _ale_lives(self) -> int:
        return self.env.unwrapped.ale.lives()

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.real_done = terminated or truncated
        lives = self._ale_lives()
        lost = 0 < lives < self.lives
        self.lives = lives
        if lost and not self.real_done:
            if self.episodic:
                terminated = True
            elif self.whole_games:
                obs, more, terminated, truncated, info = self._go_on(info)
                reward += more
        return obs, reward, terminated, truncated, info

    def _go_on(self, info):
        """Evaluation: the no-op step and FIRE steps of a training reset, without a reset."""
        total = 0.0
        for a in (0, 1, 2) if self.fire else (0,):
            obs, r, terminated, truncated, info = self.env.step(a)
            total += float(r)
            if terminated or truncated:
                break
        self.real_done = terminated or truncated
        self.lives = self._ale_lives()
        return obs, total, terminated, truncated, info

    def reset(self, **kwargs):
        if self.episodic and not self.real_done:  # a lost life: the same game goes on (EpisodicLifeEnv)
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        else:
            obs, info = self.env.reset(**kwargs)
        self.real_done = False
        if self.fire:  # FireResetEnv: FIRE, then action 2; a game that ends meanwhile starts again
            for a in (1, 2):
                obs, _, terminated, truncated, _ = self.env.step(a)
                if terminated or truncated:
                    obs, info = self.env.reset(**kwargs)
        self.lives = self._ale_lives()
        return obs, info
