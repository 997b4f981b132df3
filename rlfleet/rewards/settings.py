"""Settings of the reward signals: the ``reward_signals`` section of a behavior.

Names and defaults follow ML-Agents' trainer configuration. Each signal has a
``strength`` (its rewards are multiplied by it) and a ``gamma``; see
``docs/reward-signals-and-curricula.md`` for how PPO combines signals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlfleet.config.fields import (
    LayerCount,
    LayerWidth,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    UnitFloat,
)


@dataclass
class SignalNetworkSettings:
    """The MLPs a learned reward signal uses."""

    hidden_units: LayerWidth = 128
    """Width of each hidden layer."""
    num_layers: LayerCount = 2
    """Number of hidden layers."""

    @property
    def hidden_sizes(self) -> tuple[int, ...]:
        return (self.hidden_units,) * self.num_layers


@dataclass
class ExtrinsicSettings:
    """The environment's own reward."""

    gamma: UnitFloat = 0.99
    """Discount factor; it becomes the algorithm's ``gamma``."""
    strength: NonNegativeFloat = 1.0
    """Multiplier of the environment's reward."""


@dataclass
class CuriositySettings:
    """Intrinsic Curiosity Module (Pathak et al. 2017): reward for transitions whose
    consequence, in a feature space learned by an inverse-dynamics model, is hard to predict."""

    gamma: UnitFloat = 0.99
    """Discount factor of this signal (see the docs on how signals are combined)."""
    strength: NonNegativeFloat = 1.0
    """Multiplier of the curiosity reward (typical: 0.001 to 0.1)."""
    encoding_size: PositiveInt = 64
    """Size of the learned feature vector the forward model predicts."""
    learning_rate: PositiveFloat = 3e-4
    """Adam step size of the forward, inverse and encoder networks."""
    network_settings: SignalNetworkSettings = field(default_factory=SignalNetworkSettings)
    """Hidden layers of the encoder, forward and inverse models."""


@dataclass
class RNDSettings:
    """Random Network Distillation (Burda et al. 2018): reward for observations a trained
    predictor cannot yet match to a fixed random network's output."""

    gamma: UnitFloat = 0.99
    """Discount factor of this signal (see the docs on how signals are combined)."""
    strength: NonNegativeFloat = 1.0
    """Multiplier of the (normalised) RND reward (typical: 0.001 to 0.1)."""
    encoding_size: PositiveInt = 64
    """Output size of the random target network and of the predictor."""
    learning_rate: PositiveFloat = 1e-4
    """Adam step size of the predictor."""
    network_settings: SignalNetworkSettings = field(default_factory=SignalNetworkSettings)
    """Hidden layers of the target and predictor networks."""


@dataclass
class GAILSettings:
    """Generative Adversarial Imitation Learning (Ho & Ermon 2016): reward for transitions
    a discriminator takes for the demonstrator's."""

    demo_path: str
    """Demonstration file: ``.npz`` with ``observations`` and ``actions`` arrays
    (see :mod:`rlfleet.rewards.demonstrations`); relative paths start at the working
    directory."""
    gamma: UnitFloat = 0.99
    """Discount factor of this signal (see the docs on how signals are combined)."""
    strength: NonNegativeFloat = 1.0
    """Multiplier of the GAIL reward."""
    learning_rate: PositiveFloat = 3e-4
    """Adam step size of the discriminator."""
    use_actions: bool = False
    """Show the discriminator actions as well as observations (false: observations only,
    which also works with demonstrations whose actions differ from the agent's)."""
    network_settings: SignalNetworkSettings = field(default_factory=SignalNetworkSettings)
    """Hidden layers of the discriminator."""


@dataclass
class RewardSignalsSettings:
    """Which reward signals a behavior maximises; an absent (null) signal is off.

    Without a ``reward_signals`` section a behavior gets the extrinsic signal alone; a
    section that leaves ``extrinsic`` out trains on intrinsic rewards only (ML-Agents'
    semantics).
    """

    extrinsic: ExtrinsicSettings | None = None
    """The environment's reward."""
    curiosity: CuriositySettings | None = None
    """Intrinsic Curiosity Module."""
    rnd: RNDSettings | None = None
    """Random Network Distillation."""
    gail: GAILSettings | None = None
    """Generative Adversarial Imitation Learning."""

    def enabled(self) -> list[str]:
        """Names of the signals that are on, in a fixed order."""
        return [name for name in SIGNAL_NAMES if getattr(self, name) is not None]

    def only_the_env_reward(self) -> bool:
        """True when the combined reward is the env's own: the extrinsic signal alone, at
        strength 1 (ML-Agents' default ``reward_signals``)."""
        return (
            self.enabled() == ["extrinsic"]
            and self.extrinsic is not None
            and (self.extrinsic.strength == 1.0)
        )

    def discount(self) -> float:
        """The gamma the combined reward is discounted with: the extrinsic signal's, or
        without one the largest of the others'."""
        if self.extrinsic is not None:
            return self.extrinsic.gamma
        gammas = [getattr(self, name).gamma for name in self.enabled()]
        return max(gammas) if gammas else ExtrinsicSettings().gamma


SIGNAL_NAMES: tuple[str, ...] = ("extrinsic", "curiosity", "rnd", "gail")


def default_reward_signals() -> RewardSignalsSettings:
    """The extrinsic signal alone (what a behavior without ``reward_signals`` gets)."""
    return RewardSignalsSettings(extrinsic=ExtrinsicSettings())
