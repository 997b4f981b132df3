"""Small learnable envs, one per observation/action space combination the algorithms claim.

Each is a one-step task (a contextual bandit): the observation says what the right action
is, reward is in [0, 1] and 1 for a perfect action, and a random policy scores well below
the thresholds the tests use. One-step episodes learn in a few thousand steps, so every
space combination gets a real learning test at small cost.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class _OneStep(gym.Env[Any, Any]):
    """Shared one-step episode logic: ``_observe`` draws a state, ``_reward`` scores it."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._state = self._observe()
        return self._state, self._info()

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        reward = float(self._reward(action))
        return self._state, reward, True, False, self._info()

    def _info(self) -> dict[str, Any]:
        return {}

    def _observe(self) -> Any:
        raise NotImplementedError

    def _reward(self, action: Any) -> float:
        raise NotImplementedError


class GuessIndex(_OneStep):
    """Discrete observation ``k`` (one of ``n``), Discrete action: reward 1 for action ``k``."""

    def __init__(self, n: int = 4) -> None:
        self.observation_space = spaces.Discrete(n)
        self.action_space = spaces.Discrete(n)

    def _observe(self) -> int:
        return int(self.np_random.integers(self.observation_space.n))  # type: ignore[attr-defined]

    def _reward(self, action: Any) -> float:
        return float(int(action) == self._state)


class SteerToTarget(_OneStep):
    """Box observation: a target in [-1, 1]^2; Box action: reward ``1 - mean |a - target|``."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def _observe(self) -> np.ndarray:
        return self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)

    def _reward(self, action: Any) -> float:
        return float(1.0 - np.abs(np.asarray(action) - self._state).mean())


class MatchDigits(_OneStep):
    """MultiDiscrete observation of digits, MultiDiscrete action of the same sizes (different
    sizes per digit): reward = fraction of digits matched."""

    def __init__(self, nvec: tuple[int, ...] = (3, 2, 4)) -> None:
        self.observation_space = spaces.MultiDiscrete(nvec)
        self.action_space = spaces.MultiDiscrete(nvec)

    def _observe(self) -> np.ndarray:
        nvec = self.observation_space.nvec  # type: ignore[attr-defined]
        return (self.np_random.random(len(nvec)) * nvec).astype(np.int64)

    def _reward(self, action: Any) -> float:
        return float(np.mean(np.asarray(action) == self._state))


class CopyBits(_OneStep):
    """MultiBinary observation, MultiBinary action: reward = fraction of bits copied."""

    def __init__(self, n: int = 4) -> None:
        self.observation_space = spaces.MultiBinary(n)
        self.action_space = spaces.MultiBinary(n)

    def _observe(self) -> np.ndarray:
        return self.np_random.integers(0, 2, self.observation_space.n, dtype=np.int8)  # type: ignore[attr-defined]

    def _reward(self, action: Any) -> float:
        return float(np.mean(np.asarray(action) == self._state))


class NestedDictChoice(_OneStep):
    """Nested Dict observation; Discrete action: the answer is the ``task/which`` digit, the
    other parts (a Box, bits, a second nested digit) are distractors."""

    observation_space = spaces.Dict(
        {
            "noise": spaces.Box(-1.0, 1.0, (3,), np.float32),
            "task": spaces.Dict({"which": spaces.Discrete(3), "bits": spaces.MultiBinary(2)}),
            "other": spaces.Discrete(3),
        }
    )
    action_space = spaces.Discrete(3)

    def _observe(self) -> dict[str, Any]:
        return self.observation_space.sample()  # seeded through reset's np_random below

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is not None:
            self.observation_space.seed(seed)
        return super().reset(seed=seed, options=options)

    def _reward(self, action: Any) -> float:
        return float(int(action) == int(self._state["task"]["which"]))


class BrightSide(_OneStep):
    """uint8 image (``HWC`` or ``CHW``, ``size`` x ``size``, 1 channel) with a bright square in
    the left or the right half; Discrete action: 0 for left, 1 for right."""

    def __init__(self, channels_first: bool = False, size: int = 36) -> None:
        self.channels_first = channels_first
        self.size = size
        shape = (1, size, size) if channels_first else (size, size, 1)
        self.observation_space = spaces.Box(0, 255, shape, np.uint8)
        self.action_space = spaces.Discrete(2)

    def _observe(self) -> np.ndarray:
        size, square = self.size, self.size // 4
        self._side = int(self.np_random.integers(2))
        image = self.np_random.integers(0, 40, (size, size), dtype=np.uint8)
        row = int(self.np_random.integers(0, size - square))
        col = int(self.np_random.integers(0, size // 2 - square)) + size // 2 * self._side
        image[row : row + square, col : col + square] = 255
        return image[None] if self.channels_first else image[..., None]

    def _reward(self, action: Any) -> float:
        return float(int(action) == self._side)


def bright_side_trainer(algo_class: Any, config: Any, steps: int, seed: int) -> Any:
    """An off-policy trainer of ``algo_class`` with ``config`` on :class:`BrightSide` (4 envs,
    4 test envs): one epoch of ``steps`` env steps, then a test step of 100 episodes."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from rlfleet.train.loop import TrainerConfig
    from rlfleet.train.trainer import OffPolicyTrainer

    envs = SyncVectorEnv([BrightSide] * 4, autoreset_mode=AutoresetMode.NEXT_STEP)
    test_envs = SyncVectorEnv([BrightSide] * 4, autoreset_mode=AutoresetMode.NEXT_STEP)
    space, actions = envs.single_observation_space, envs.single_action_space
    return OffPolicyTrainer(
        algo_class(space, actions, config, seed=seed),
        envs,
        test_envs,
        TrainerConfig(
            max_steps=steps,
            epoch_num_steps=steps,
            test_step_num_episodes=100,
            show_progress=False,
            verbose=False,
        ),
        seed=seed,
    )


def assert_bright_side_run_repeats_and_round_trips(trainer_of: Any, directory: Any) -> Any:
    """Train two runs of :func:`bright_side_trainer` (``trainer_of()``: a new trainer, the same
    seed): the same parameters. A checkpoint of one, saved in ``directory``, loads into a new
    instance of another seed with the same parameters and greedy actions. Returns the trained
    algorithm."""
    import torch

    from rlfleet.checkpoint import load_checkpoint, save_checkpoint

    trainer = trainer_of()
    trainer.run()
    algo = trainer.algorithm
    again = trainer_of()
    again.run()
    assert torch.equal(algo.parameters_vector(), again.algorithm.parameters_vector())
    meta = {"algorithm": algo.name}
    save_checkpoint(directory / "ckpt", {"algorithm": algo.state_dict()}, meta)
    state, _ = load_checkpoint(directory / "ckpt")
    fresh = type(algo)(algo.observation_space, algo.action_space, algo.config, seed=7)
    fresh.load_state_dict(state["algorithm"])
    assert torch.equal(algo.parameters_vector(), fresh.parameters_vector())
    obs = np.random.default_rng(0).integers(0, 256, (16, 36, 36, 1), dtype=np.uint8)
    np.testing.assert_array_equal(algo.predict(obs), fresh.predict(obs))
    return algo


class ImageAndVector(_OneStep):
    """Dict of an image (the BrightSide picture) and a vector; Discrete(3) action: 2 when
    ``vector[0] > 0``, else the image's side. Ignoring the image scores 0.75, ignoring the
    vector 0.5: a score above that needs both parts."""

    def __init__(self) -> None:
        self._image = BrightSide()
        self.observation_space = spaces.Dict(
            {
                "image": self._image.observation_space,
                "vector": spaces.Box(-1.0, 1.0, (2,), np.float32),
            }
        )
        self.action_space = spaces.Discrete(3)

    def _observe(self) -> dict[str, Any]:
        self._image.np_random = self.np_random
        image = self._image._observe()
        vector = self.np_random.uniform(-1.0, 1.0, 2).astype(np.float32)
        self._answer = 2 if vector[0] > 0 else self._image._side
        return {"image": image, "vector": vector}

    def _reward(self, action: Any) -> float:
        return float(int(action) == self._answer)


class MaskedPick(gym.Env[Any, Any]):
    """A random legal subset of actions each step (at least one); reward 1 for the highest
    legal action. Records every illegal action it receives in ``violations``.

    The mask comes in ``info["action_mask"]`` or, with ``mask_in_obs``, as the
    ``action_mask`` key of a Dict observation. Episodes last ``length`` steps. The action
    space is Discrete, MultiDiscrete (one legal subset per sub-action) or MultiBinary
    (``[may be 0, may be 1]`` per bit, at least one true).
    """

    def __init__(self, kind: str = "discrete", mask_in_obs: bool = False, length: int = 5) -> None:
        self.kind = kind
        self.mask_in_obs = mask_in_obs
        self.length = length
        if kind == "discrete":
            self.action_space: spaces.Space[Any] = spaces.Discrete(5)
            self.segments = [5]
        elif kind == "multi_discrete":
            self.action_space = spaces.MultiDiscrete([3, 4])
            self.segments = [3, 4]
        else:
            self.action_space = spaces.MultiBinary(3)
            self.segments = [2, 2, 2]
        width = sum(self.segments)
        self.violations = 0
        self.steps = 0
        vector = spaces.Box(0.0, 1.0, (width,), np.float32)
        self.observation_space: spaces.Space[Any] = (
            spaces.Dict({"state": vector, "action_mask": spaces.MultiBinary(width)})
            if mask_in_obs
            else vector
        )

    def _new_mask(self) -> None:
        blocks = []
        for size in self.segments:
            block = self.np_random.random(size) < 0.5
            block[self.np_random.integers(size)] = True
            blocks.append(block)
        self._mask = np.concatenate(blocks).astype(np.int8)

    def _obs_info(self) -> tuple[Any, dict[str, Any]]:
        state = self._mask.astype(np.float32)
        if self.mask_in_obs:
            return {"state": state, "action_mask": self._mask.copy()}, {}
        return state, {"action_mask": self._mask.copy()}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self._new_mask()
        return self._obs_info()

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        chosen = self._chosen_entries(action)
        legal = bool(self._mask[chosen].all())
        self.violations += not legal
        best = [
            int(np.flatnonzero(block)[-1])
            for block in np.split(self._mask.astype(bool), np.cumsum(self.segments)[:-1])
        ]
        picks = [int(i - start) for i, start in zip(chosen, self._starts(), strict=True)]
        reward = float(legal) * float(np.mean([p == b for p, b in zip(picks, best, strict=True)]))
        self.t += 1
        self._new_mask()
        obs, info = self._obs_info()
        return obs, reward, False, self.t >= self.length, info

    def _starts(self) -> list[int]:
        return [int(s) for s in np.cumsum([0, *self.segments[:-1]])]

    def _chosen_entries(self, action: Any) -> list[int]:
        """Indices into the flat mask of the entries the action uses."""
        values = np.atleast_1d(np.asarray(action)).reshape(-1)
        return [start + int(v) for start, v in zip(self._starts(), values, strict=True)]


class RememberCue(gym.Env[np.ndarray, int]):
    """A memory task: the first observation shows one of ``num_cues`` cues (one-hot), the
    next ``delay`` observations show nothing, and the last one asks for an answer (its final
    entry is 1). Reward 1 for answering the cue then, 0 otherwise.

    The answer step's observation is the same whatever the cue, so a policy without memory
    scores ``1 / num_cues`` at best; a recurrent one can score 1.
    """

    def __init__(self, num_cues: int = 4, delay: int = 3) -> None:
        self.num_cues = num_cues
        self.delay = delay
        self.observation_space = spaces.Box(0.0, 1.0, (num_cues + 1,), np.float32)
        self.action_space = spaces.Discrete(num_cues)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(self.num_cues))
        self._t = 0
        obs = np.zeros(self.num_cues + 1, np.float32)
        obs[self._cue] = 1.0
        return obs, {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        answering = self._t == self.delay + 1
        self._t += 1
        obs = np.zeros(self.num_cues + 1, np.float32)
        if self._t == self.delay + 1:
            obs[-1] = 1.0  # the question
        reward = float(int(action) == self._cue) if answering else 0.0
        return obs, reward, answering, False, {}


class StrictMaskedPick(MaskedPick):
    """:class:`MaskedPick` (Discrete, its mask in ``info``) that raises on an illegal action:
    for code paths whose env the test cannot reach to count violations (``rlfleet play``)."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if not bool(self._mask[self._chosen_entries(action)].all()):
            raise ValueError(f"illegal action {action} under mask {self._mask.tolist()}")
        return super().step(action)
