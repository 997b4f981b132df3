"""Behavioral cloning beside the RL loss: ML-Agents' ``behavioral_cloning`` trainer setting.

After each update step of the policy, :meth:`BehavioralCloning.update` runs ``num_epoch``
passes over the demonstrations in shuffled minibatches of ``batch_size``, each a gradient step
of the policy's imitation loss (:meth:`rlfleet.algos.kinds.ImitationPolicy.imitation_loss`:
cross-entropy for discrete actions, mean squared error of a sampled action for continuous
ones). As in ML-Agents' ``BCModule``:

- the steps use an Adam optimiser of their own over the policy's parameters, whose learning
  rate is the policy's ``learning_rate`` times ``strength``: ``strength`` weighs the cloning
  through its step size, not by scaling the loss;
- with ``steps > 0`` that learning rate decays linearly to 0 over the first ``steps``
  environment steps (after which cloning stops); ``steps: 0`` keeps it constant;
- ``samples_per_update > 0`` caps the minibatches of a pass at
  ``samples_per_update // batch_size``; 0 passes over all the demonstrations.

The history gets ``bc/loss`` (mean over the update's minibatches) and ``bc/strength``
(``strength`` after the decay). Demonstrations are rlfleet's ``.npz`` files
(:mod:`rlfleet.rewards.demonstrations`, the files GAIL reads); ML-Agents' ``.demo`` files are
Unity recordings rlfleet cannot read. The optimiser and the sampling generator are saved in
checkpoints and restored on resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import ImitationPolicy
from rlfleet.config.fields import NonNegativeFloat, NonNegativeInt, PositiveInt
from rlfleet.errors import ConfigError
from rlfleet.nn.optim import optimizer_step
from rlfleet.rewards.demonstrations import load_demonstrations
from rlfleet.seeding import stream_seed

MIN_LEARNING_RATE = 1e-10
"""Below this learning rate cloning has decayed away and stops (ML-Agents' floor)."""


@dataclass
class BehavioralCloningSettings:
    """Behavioral cloning beside the RL loss (ML-Agents' names and defaults)."""

    demo_path: str
    """Demonstrations to imitate: an ``.npz`` file of ``observations`` and ``actions`` (see
    ``docs/reward-signals-and-curricula.md``); ML-Agents' ``.demo`` files cannot be read."""
    strength: NonNegativeFloat = 1.0
    """Learning rate of cloning relative to the policy's ``learning_rate``."""
    steps: NonNegativeInt = 0
    """Environment steps over which ``strength`` decays linearly to 0 (0: constant)."""
    batch_size: PositiveInt | None = None
    """Demonstrations per gradient step (unset: the algorithm's ``batch_size``)."""
    num_epoch: PositiveInt | None = None
    """Passes over the demonstrations per update (unset: the algorithm's ``num_epochs``, 1
    for an algorithm without)."""
    samples_per_update: NonNegativeInt = 0
    """Demonstrations used per pass at most (0: all of them)."""


def check_demo_path(path: str, where: str = "behavioral_cloning.demo_path") -> None:
    """Refuse an ML-Agents ``.demo`` file before anything is built.

    Raises:
        ConfigError: ``path`` ends in ``.demo``.
    """
    if Path(path).suffix.lower() == ".demo":
        raise ConfigError(
            f"{where}: {path!r} is an ML-Agents .demo file (a Unity recording), which rlfleet "
            "cannot read; expected an .npz of observations and actions (record one with "
            "rlfleet.rewards.demonstrations.record_demonstrations and save_demonstrations)"
        )


class BehavioralCloning:
    """Clones the demonstrations into ``algorithm``'s policy after each of its updates.

    Args:
        settings: what to imitate and how (:class:`BehavioralCloningSettings`).
        algorithm: the policy (PPO, SAC: an :class:`ImitationPolicy`), feed-forward.
        seed: seeds the shuffling and the sampled actions.

    Raises:
        ConfigError: the algorithm cannot clone, or the demonstration file is unreadable or
            does not fit the algorithm's spaces.
    """

    def __init__(
        self, settings: BehavioralCloningSettings, algorithm: Algorithm[Any], *, seed: int = 0
    ) -> None:
        if not isinstance(algorithm, ImitationPolicy):
            raise ConfigError(
                f"behavioral_cloning: {algorithm.name} has no imitation loss (ppo and sac have one)"
            )
        if algorithm.initial_state(1) is not None:
            raise ConfigError(
                f"behavioral_cloning: {algorithm.name} has a recurrent policy; behavioral "
                "cloning needs a feed-forward one (set network_settings.memory: null)"
            )
        check_demo_path(settings.demo_path)
        demos = load_demonstrations(
            settings.demo_path, algorithm.observation_space, algorithm.action_space
        )
        config = algorithm.config
        self.settings = settings
        self.algorithm = algorithm
        self.policy: ImitationPolicy = algorithm
        self.observations = torch.from_numpy(demos.observations)
        self.actions = torch.from_numpy(demos.actions).to(algorithm.device)
        self.batch_size = min(settings.batch_size or config.batch_size, len(demos))
        self.num_epoch: int = settings.num_epoch or getattr(config, "num_epochs", None) or 1
        self.initial_learning_rate = float(config.learning_rate) * settings.strength
        self.parameters = self.policy.imitation_parameters()
        self.optimizer = torch.optim.Adam(self.parameters, lr=self.initial_learning_rate)
        # A CPU generator, as the algorithm's: draws move to the networks' device.
        self.generator = torch.Generator().manual_seed(stream_seed(seed, "imitation"))
        self.shuffle_generator = torch.Generator().manual_seed(stream_seed(seed, "shuffle"))

    def learning_rate(self, env_step: int) -> float:
        """The cloning learning rate after ``env_step`` environment steps."""
        steps = self.settings.steps
        if steps == 0:
            return self.initial_learning_rate
        return self.initial_learning_rate * max(0.0, 1.0 - env_step / steps)

    def strength(self, env_step: int) -> float:
        """``strength`` after its decay over ``env_step`` environment steps."""
        if self.initial_learning_rate == 0.0:
            return 0.0
        return self.settings.strength * self.learning_rate(env_step) / self.initial_learning_rate

    def update(self, env_step: int) -> dict[str, float]:
        """``num_epoch`` passes of imitation steps; returns ``bc/loss`` and ``bc/strength``
        (``bc/strength`` alone once the decay has reached 0: no step is taken)."""
        lr = self.learning_rate(env_step)
        metrics = {"bc/strength": self.strength(env_step)}
        if lr <= MIN_LEARNING_RATE:
            return metrics
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        n = len(self.observations)
        num_batches = n // self.batch_size
        cap = self.settings.samples_per_update // self.batch_size
        if cap > 0:
            num_batches = min(num_batches, cap)
        total = torch.zeros((), device=self.algorithm.device)
        for _ in range(self.num_epoch):
            order = torch.randperm(n, generator=self.shuffle_generator)
            for i in range(num_batches):
                index = order[i * self.batch_size : (i + 1) * self.batch_size]
                obs = self.algorithm.preprocess(self.observations[index])
                actions = self.actions[index.to(self.actions.device)]
                loss = self.policy.imitation_loss(obs, actions, self.generator)
                # The algorithm's guard: a non-finite loss or gradient follows its nan_policy.
                optimizer_step(self.algorithm, self.optimizer, loss, self.parameters)
                total += loss.detach()
        for parameter in self.parameters:
            parameter.grad = None  # leave no gradient behind for the algorithm's own steps
        metrics["bc/loss"] = float(total) / max(num_batches * self.num_epoch, 1)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The optimiser and the generators, for checkpoints."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "shuffle_generator": self.shuffle_generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.shuffle_generator.set_state(state["shuffle_generator"])
