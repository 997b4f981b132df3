"""The :class:`Algorithm` interface every rlfleet algorithm implements.

An algorithm owns its networks, optimisers and RNG; it does not own data collection.
Collectors call :meth:`Algorithm.preprocess` and :meth:`Algorithm.act` on whole batches of
observations, trainers call :meth:`Algorithm.update` with collected data. Spaces are
checked at construction, never deep inside training.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlfleet.envs.spaces import describe_space
from rlfleet.errors import CheckpointError, ConfigError, EnvSpecError, NonFiniteError
from rlfleet.types import PolicyStep

ConfigT = TypeVar("ConfigT")
AlgorithmKind = Literal["on_policy", "off_policy", "offline", "distributed"]
NanPolicy = Literal["raise", "skip_batch"]


class Algorithm(ABC, Generic[ConfigT]):
    """Base class: construction checks spaces; subclasses build networks and implement
    :meth:`act`, :meth:`update` and :meth:`modules` / :meth:`optimizers`."""

    name: ClassVar[str]
    """Registry name, as typed on the command line (``ppo``)."""
    kind: ClassVar[AlgorithmKind]
    """Which trainer loop drives it."""
    config_class: ClassVar[type[Any]]
    """The dataclass of its hyperparameters."""
    action_spaces: ClassVar[tuple[type[spaces.Space[Any]], ...]]
    """Action space types it supports."""
    observation_spaces: ClassVar[tuple[type[spaces.Space[Any]], ...]] = (spaces.Box,)
    """Observation space types it supports."""

    def __init__(
        self,
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        config: ConfigT,
        *,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        self.check_spaces(observation_space, action_space)
        self.observation_space = observation_space
        self.action_space = action_space
        self.config = config
        self.seed = seed
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)
        """Drives every random draw the algorithm makes (sampling, minibatch order)."""
        self.progress = 0.0
        """Fraction of the training budget used, in [0, 1]; drives schedules."""
        self.lr_scale = 1.0
        """Multiplier on the scheduled learning rate (reduce-on-plateau lowers it)."""
        self.gradient_steps = 0
        self.nan_policy: NanPolicy = "raise"
        """A non-finite loss or gradient: ``raise`` NonFiniteError, or ``skip_batch``."""
        self.skipped_batches = 0

    @classmethod
    def check_spaces(
        cls, observation_space: spaces.Space[Any], action_space: spaces.Space[Any]
    ) -> None:
        """Refuse spaces this algorithm cannot handle, naming algorithms that can."""
        from rlfleet.algos.registry import algorithms_supporting

        if not isinstance(action_space, cls.action_spaces):
            others = algorithms_supporting(action_space=action_space)
            raise EnvSpecError(
                f"{cls.name} does not support action space {describe_space(action_space)}; "
                f"it supports {_names(cls.action_spaces)}"
                + (f". Algorithms for this space: {', '.join(others)}" if others else "")
            )
        if not isinstance(observation_space, cls.observation_spaces):
            others = algorithms_supporting(observation_space=observation_space)
            raise EnvSpecError(
                f"{cls.name} does not support observation space "
                f"{describe_space(observation_space)}; it supports "
                f"{_names(cls.observation_spaces)}"
                + (f". Algorithms for this space: {', '.join(others)}" if others else "")
            )
        if isinstance(action_space, spaces.Box) and not (
            np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))
        ):
            raise EnvSpecError(
                f"{cls.name}: Box action space {describe_space(action_space)} has infinite "
                "bounds; rlfleet needs finite action bounds to clip and scale actions"
            )

    def build_networks(self) -> None:
        """Run :meth:`_build` with the global torch RNG seeded from ``seed``.

        The global RNG state is restored afterwards, so constructing an algorithm never
        changes randomness elsewhere, and the same seed gives the same initial weights.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self._build()

    @abstractmethod
    def _build(self) -> None:
        """Create networks and optimisers."""

    # ----------------------------------------------------------------- acting
    def preprocess(self, obs: torch.Tensor, *, update_stats: bool = False) -> torch.Tensor:
        """Turn raw observations into what :meth:`act` and the update see (and store).

        The default is a float32 view; algorithms with observation normalisation fold the
        batch into their running statistics when ``update_stats`` is true.
        """
        return obs.to(self.device, torch.float32)

    @abstractmethod
    def act(self, obs: torch.Tensor, *, deterministic: bool = False) -> PolicyStep:
        """Choose actions for a batch of preprocessed observations (no gradients)."""

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """Convert policy actions to what the env accepts: Box actions are clipped to bounds."""
        array: np.ndarray = actions.detach().cpu().numpy()
        if isinstance(self.action_space, spaces.Box):
            clipped: np.ndarray = np.clip(array, self.action_space.low, self.action_space.high)
            return clipped.astype(self.action_space.dtype, copy=False)
        return array.astype(np.int64, copy=False)

    @torch.inference_mode()
    def predict(self, obs: np.ndarray, *, deterministic: bool = True) -> np.ndarray:
        """Actions for a batch of raw env observations, ready for ``env.step``."""
        tensor = self.preprocess(torch.as_tensor(obs))
        return self.env_actions(self.act(tensor, deterministic=deterministic).actions)

    # --------------------------------------------------------------- training
    @abstractmethod
    def update(self, batch: Any) -> dict[str, float]:
        """One update step on collected data; returns named scalar metrics.

        On-policy algorithms receive a :class:`~rlfleet.data.rollout.RolloutStorage` and
        accept keyword-only ``batch_size`` and ``num_repetitions`` overrides (see
        :class:`~rlfleet.train.trainer.OnPolicyTrainer`). Off-policy algorithms receive a
        :class:`~rlfleet.data.replay.ReplayBuffer` and keyword-only ``batch_size`` and
        ``num_gradient_steps``, and sample a fresh minibatch for each gradient step (see
        :class:`~rlfleet.train.trainer.OffPolicyTrainer`).
        """

    def gradients_are_finite(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
        """Call after ``backward`` and before ``optimizer.step``: False means skip the step.

        A NaN or inf in the loss or the gradient norm raises NonFiniteError (``raise``) or
        counts a skipped batch (``skip_batch``); either way the optimizer never sees it, so
        the parameters and optimizer state stay as they were.
        """
        if bool(torch.isfinite(loss.detach() + grad_norm)):
            return True
        if self.nan_policy == "raise":
            raise NonFiniteError(
                f"{self.name}: non-finite loss ({float(loss.detach()):.4g}) or gradient norm "
                f"({float(grad_norm):.4g}) at gradient step {self.gradient_steps}; the "
                "parameters were left unchanged (set nan_policy: skip_batch to skip such "
                "batches, or lower the learning rate)"
            )
        self.skipped_batches += 1
        return False

    def compile_update(self) -> None:
        """Run the tensor maths of :meth:`update` through ``torch.compile`` from now on.

        Algorithms that keep their loss a pure function of fixed-shape tensors override this;
        the rest refuse, naming themselves.
        """
        raise ConfigError(f"{self.name} does not support compiling its update (th_compile)")

    def set_progress(self, progress: float) -> None:
        """Tell the algorithm how much of the training budget is used (for schedules)."""
        self.progress = min(max(progress, 0.0), 1.0)

    # ------------------------------------------------------------ persistence
    @abstractmethod
    def modules(self) -> dict[str, nn.Module]:
        """Networks (and normalisers) whose state is saved."""

    @abstractmethod
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Optimisers whose state is saved."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly: weights, optimisers, RNG, counters."""
        return {
            "modules": {k: m.state_dict() for k, m in self.modules().items()},
            "optimizers": {k: o.state_dict() for k, o in self.optimizers().items()},
            "generator": self.generator.get_state(),
            "progress": self.progress,
            "lr_scale": self.lr_scale,
            "gradient_steps": self.gradient_steps,
            "skipped_batches": self.skipped_batches,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output; mismatched networks give a CheckpointError."""
        try:
            for key, module in self.modules().items():
                module.load_state_dict(state["modules"][key])
            for key, optimizer in self.optimizers().items():
                if key in state.get("optimizers", {}):
                    optimizer.load_state_dict(state["optimizers"][key])
            self.generator.set_state(state["generator"])
        except (KeyError, RuntimeError, ValueError) as err:
            raise CheckpointError(
                f"checkpoint does not match this {self.name} model: {str(err).splitlines()[0]}"
            ) from err
        self.progress = float(state["progress"])
        self.lr_scale = float(state["lr_scale"])
        self.gradient_steps = int(state["gradient_steps"])
        self.skipped_batches = int(state.get("skipped_batches", 0))

    def parameters_vector(self) -> torch.Tensor:
        """All trainable parameters as one flat tensor (for comparisons in tests and tools)."""
        return torch.cat(
            [p.detach().reshape(-1) for m in self.modules().values() for p in m.parameters()]
        )


def _names(types: tuple[type[Any], ...]) -> str:
    return ", ".join(t.__name__ for t in types)
