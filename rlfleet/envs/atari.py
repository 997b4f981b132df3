"""Atari 2600 preprocessing (ALE envs from ``ale-py``, ROMs bundled with it).

The DeepMind preprocessing (Mnih et al. 2015; Machado et al. 2018 for the settings), with
Stable-Baselines3's ``AtariWrapper`` defaults plus a 4-frame stack:

==========================  ==========================================================
no-op reset                 a random number (1..``noop_max``) of no-ops after reset
frame skip with max-pool    each action repeated ``frame_skip`` times; the observation
                            is the pixel-wise max of the last two frames (Atari
                            sprites flicker between frames)
episodic life               a lost life ends the episode for the learner; the game
                            itself is only reset at game over
fire reset                  FIRE after reset in games that wait for it (Breakout, ...);
                            in whole games (test envs), at the start of each life
grayscale 84x84             luminance frame resized with area interpolation
frame stack                 the last ``frame_stack`` frames as ``[stack, 84, 84]`` uint8
reward clipping             rewards clipped to [-1, 1] (their sign: ALE rewards are integers)
==========================  ==========================================================

Gymnasium does most of it: :class:`gymnasium.wrappers.AtariPreprocessing` (no-op reset,
frame skip with max-pool, grayscale, resize), :class:`gymnasium.wrappers.FrameStackObservation`
and :class:`gymnasium.wrappers.ClipReward`. This module keeps what gymnasium lacks:

- :class:`FireReset`: gymnasium has no fire reset.
- :class:`FireAtLifeStart` (and :class:`VectorFireAtLifeStart` for ale-py's vector env):
  a training episode ends at a lost life and the fire reset that follows presses FIRE, so a
  policy need not learn to; a test env keeps the whole game, where such a policy would stand
  still after its first lost life until the game's frame limit (27,000 steps of Breakout)
  ended the episode. There the first two actions of each life are FIRE. Two, because
  sticky actions can swallow a press: on Breakout, under a policy that only plays NOOP
  (16 envs for 1,500 steps, both vector modes), one press after each lost life left 5 of
  359 games standing still, two left none of 1,230.
- :class:`EpisodicLife`: ``AtariPreprocessing(terminal_on_life_loss=True)`` ends the episode
  on a lost life, but its ``reset`` then restarts the whole game, so an agent would never
  see a game past its first life; DeepMind's trick continues the game after a lost life and
  resets it only at game over.
- :class:`FinalFrame`: when a game ends in the middle of a frame skip, ``AtariPreprocessing``
  stops before reading the screen and returns the previous step's frame; the final
  observation of a game is then the true final screen (what a truncated episode
  bootstraps from), as the preprocessing always returned.

:func:`rlfleet.envs.make.make_vec_env` applies this to every ALE env id (``ALE/Pong-v5``,
``PongNoFrameskip-v4``, ...). Ids with ale-py's native vector entry point (the ``-v5``
ids) run as :class:`ale_py.vector_env.AtariVectorEnv`, which does the same preprocessing
in C++ threads; other ids, and ``vector_mode`` ``sync``/``async``, run the wrappers of this
module. Both give the same ``[stack, 84, 84]`` uint8 observations, so a policy trained on
one plays on the other (``rlfleet play`` uses the wrappers on a single env).

Test envs (and ``eval``/``play``) keep whole games and raw rewards
(:meth:`AtariConfig.for_evaluation`): test returns are game scores, while ``train/``
returns are in clipped, per-life units.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, ClipReward, FrameStackObservation

from rlfleet.config.fields import NonNegativeInt, PositiveInt, UnitFloat
from rlfleet.errors import MissingDependencyError

ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"


@dataclass
class AtariConfig:
    """Preprocessing of ALE envs (ignored for other envs); defaults: SB3's AtariWrapper."""

    preprocess: bool = True
    """Apply the preprocessing (false: raw frames, as the env id gives them)."""
    noop_max: NonNegativeInt = 30
    """Largest number of no-ops after a reset (0: none)."""
    frame_skip: PositiveInt = 4
    """Frames each action is repeated for; observations max-pool the last two."""
    screen_size: PositiveInt = 84
    """Height and width of the resized grayscale frame."""
    frame_stack: PositiveInt = 4
    """Frames stacked into one observation."""
    terminal_on_life_loss: bool = True
    """End training episodes when a life is lost (never for test envs)."""
    clip_reward: bool = True
    """Replace training rewards by their sign (never for test envs)."""
    fire_reset: bool = True
    """Press FIRE after a reset in games whose action set has it (and, in whole games, as
    the first two actions of each life)."""
    repeat_action_probability: UnitFloat | None = None
    """Sticky actions: chance the previous action repeats (unset: the env id's own value,
    0.25 for ``-v5`` ids, 0 for ``NoFrameskip-v4``)."""

    def for_evaluation(self) -> AtariConfig:
        """The same preprocessing with whole games and raw rewards, for test episodes."""
        return replace(self, terminal_on_life_loss=False, clip_reward=False)


def is_atari(spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether an env spec is an ALE Atari game."""
    return str(spec.entry_point) == ATARI_ENTRY_POINT


def register_atari_envs() -> bool:
    """Register ale-py's env ids with Gymnasium; False when ale-py is not installed."""
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


def require_ale(env_id: str) -> None:
    """Raise a MissingDependencyError for an ALE id when ale-py is missing."""
    if not register_atari_envs():
        raise MissingDependencyError(
            f"{env_id!r} is an Atari env: install ale-py with `pip install 'rlfleet[atari]'`"
        )


def make_atari_env(
    spec: gym.envs.registration.EnvSpec,
    config: AtariConfig,
    *,
    render_mode: str | None = None,
    **kwargs: Any,
) -> gym.Env[Any, Any]:
    """One preprocessed ALE env: the emulator at frame skip 1 plus the wrappers below."""
    if not config.preprocess:
        return gym.make(spec.id, render_mode=render_mode, **kwargs)
    options: dict[str, Any] = {"frameskip": 1, "obs_type": "grayscale", **kwargs}
    if config.repeat_action_probability is not None:
        options["repeat_action_probability"] = config.repeat_action_probability
    env: gym.Env[Any, Any] = gym.make(spec.id, render_mode=render_mode, **options)
    return wrap_atari(env, config)


def wrap_atari(env: gym.Env[Any, Any], config: AtariConfig) -> gym.Env[Any, Any]:
    """The preprocessing wrappers around a frame-skip-1 grayscale ALE env.

    The order is Stable-Baselines3's: no-op reset and frame skip innermost, then episodic
    life, fire reset, resize (all but these two in :class:`~gymnasium.wrappers.AtariPreprocessing`),
    frame stack and reward clipping.
    """
    try:
        env = AtariPreprocessing(
            env,
            noop_max=config.noop_max,
            frame_skip=config.frame_skip,
            screen_size=config.screen_size,
            terminal_on_life_loss=False,
            grayscale_obs=True,
        )
    except gym.error.DependencyNotInstalled as err:
        raise MissingDependencyError(
            "Atari preprocessing resizes frames with OpenCV: "
            "pip install 'rlfleet[atari]' (opencv-python-headless)"
        ) from err
    env = FinalFrame(env, config.screen_size)
    if config.terminal_on_life_loss:
        env = EpisodicLife(env)
    meanings: list[str] = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
    if config.fire_reset and "FIRE" in meanings:
        env = FireReset(env)
        if not config.terminal_on_life_loss:
            env = FireAtLifeStart(env, meanings.index("FIRE"))
    env = FrameStackObservation(env, config.frame_stack, padding_type="reset")
    if config.clip_reward:
        env = ClipReward(env, -1.0, 1.0)
    return env


def make_native_vec_env(
    spec: gym.envs.registration.EnvSpec,
    num_envs: int,
    config: AtariConfig,
    **kwargs: Any,
) -> gym.vector.VectorEnv[Any, Any, Any]:
    """ale-py's C++ vector env with the same preprocessing as :func:`wrap_atari`."""
    from ale_py import Action
    from ale_py.vector_env import AtariVectorEnv

    options: dict[str, Any] = {
        key: spec.kwargs[key]
        for key in ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode")
        if key in spec.kwargs
    }
    if config.repeat_action_probability is not None:
        options["repeat_action_probability"] = config.repeat_action_probability
    options.update(kwargs)
    envs = AtariVectorEnv(
        game=spec.kwargs["game"],
        num_envs=num_envs,
        frameskip=config.frame_skip,
        noop_max=config.noop_max,
        episodic_life=config.terminal_on_life_loss,
        reward_clipping=config.clip_reward,
        use_fire_reset=config.fire_reset,
        img_height=config.screen_size,
        img_width=config.screen_size,
        stack_num=config.frame_stack,
        grayscale=True,
        maxpool=True,
        **options,
    )
    action_set = list(envs.ale.get_action_set())
    if config.fire_reset and not config.terminal_on_life_loss and Action.FIRE in action_set:
        return VectorFireAtLifeStart(envs, action_set.index(Action.FIRE))
    return envs


# ------------------------------------------------------------------- wrappers
class FinalFrame(gym.Wrapper[np.ndarray, int, np.ndarray, int]):
    """The final observation of a game is its final screen, resized.

    ``AtariPreprocessing`` leaves its frame skip before reading the screen when the game
    ends, so it returns the previous step's frame there; this replaces that observation with
    the screen the game ended on (max-pooled with itself, as a lone frame is).
    """

    def __init__(self, env: gym.Env[np.ndarray, int], size: int) -> None:
        super().__init__(env)
        import cv2  # optional (the atari extra); AtariPreprocessing has checked it is installed

        self._cv2 = cv2
        self.size = size

    def step(self, action: int) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            screen = self.unwrapped.ale.getScreenGrayscale()  # type: ignore[attr-defined]
            obs = self._cv2.resize(
                screen, (self.size, self.size), interpolation=self._cv2.INTER_AREA
            )
        return obs, reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper[np.ndarray, int, np.ndarray, int]):
    """A lost life ends the episode; ``reset`` then continues the game with a no-op and
    truly resets only after game over (DeepMind's value-estimation trick)."""

    def __init__(self, env: gym.Env[np.ndarray, int]) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: int) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self._lives()
        # Some games sit at 0 lives for a few frames before game over: only count a loss
        # while lives remain, so the env reports one end, not two.
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if self.game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(seed=seed, options=options)
        self.lives = self._lives()
        self.game_over = False
        return obs, info

    def _lives(self) -> int:
        return int(self.unwrapped.ale.lives())  # type: ignore[attr-defined]


class FireReset(gym.Wrapper[np.ndarray, int, np.ndarray, int]):
    """Press FIRE (then action 2) after a reset, for games that wait for it to start."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        for action in (1, 2):
            obs, _, terminated, truncated, _ = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class FireAtLifeStart(gym.Wrapper[np.ndarray, int, np.ndarray, int]):
    """In a whole game, the first ``presses`` actions of each life (after a reset and after
    a lost life) are FIRE, for games that wait for it; the policy's actions for those steps
    are replaced. More than one press, because sticky actions can swallow one."""

    def __init__(self, env: gym.Env[np.ndarray, int], fire: int, presses: int = 2) -> None:
        super().__init__(env)
        self.fire = fire
        self.presses = presses
        self.lives = 0
        self.pending = 0

    def step(self, action: int) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.pending:
            action = self.fire
            self.pending -= 1
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = int(self.unwrapped.ale.lives())  # type: ignore[attr-defined]
        if 0 < lives < self.lives and not (terminated or truncated):
            self.pending = self.presses
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.lives = int(self.unwrapped.ale.lives())  # type: ignore[attr-defined]
        self.pending = self.presses
        return obs, info


class VectorFireAtLifeStart(gym.vector.VectorWrapper):
    """:class:`FireAtLifeStart` for ale-py's next-step-autoreset vector env, from the
    ``lives`` in its info."""

    def __init__(
        self, env: gym.vector.VectorEnv[Any, Any, Any], fire: int, presses: int = 2
    ) -> None:
        super().__init__(env)
        self.fire = fire
        self.presses = presses
        self.lives = np.zeros(env.num_envs, dtype=np.int64)
        self.pending = np.zeros(env.num_envs, dtype=np.int64)
        self.done = np.zeros(env.num_envs, dtype=bool)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        press = self.pending > 0
        if press.any():
            actions = np.where(press, self.fire, actions).astype(actions.dtype)
            self.pending -= press
        obs, reward, terminated, truncated, info = self.env.step(actions)
        lives = np.asarray(info["lives"], dtype=np.int64)
        ended = terminated | truncated
        # A new game starts on the step after an end (its reset step); a new life, on the
        # step after a lost one.
        lost = (lives > 0) & (lives < self.lives) & ~ended
        self.pending[self.done | lost] = self.presses
        self.done = ended
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.lives = np.asarray(info["lives"], dtype=np.int64)
        mask = (options or {}).get("reset_mask")
        restarted = np.ones(self.num_envs, dtype=bool) if mask is None else mask
        self.pending[restarted] = self.presses
        self.done[restarted] = False
        return obs, info
