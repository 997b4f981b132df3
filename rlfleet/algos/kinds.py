"""The typed contracts of the four kinds of algorithm, one per trainer loop.

An algorithm's ``kind`` says which trainer drives it; its contract says, for mypy, what that
trainer may call: the signature of ``update`` and the hyperparameters the trainer reads
from ``algorithm.config``. Every algorithm class names its contract among its bases
(``class PPO(Algorithm[PPOConfig], OnPolicyAlgorithm)``), so mypy checks that its ``update``
and its config honour the contract. A contract is an interface, not a parent: inheritance
between algorithms stays one level deep (``Algorithm`` -> ``PPO``).

========================  ===================  =================================================
kind                      contract             ``update`` learns from
========================  ===================  =================================================
``on_policy``             OnPolicyAlgorithm    the fresh rollout (:class:`RolloutStorage`)
``off_policy``            OffPolicyAlgorithm   minibatches it samples from a
                                               :class:`~rlfleet.data.source.TransitionSource`
``offline``               OfflineAlgorithm     the same, drawn from a fixed dataset
``distributed``           ActorLearnerAlgorithm  actor fragments gathered in a RolloutStorage
========================  ===================  =================================================

Trainers turn an :class:`~rlfleet.algos.base.Algorithm` into its contract once, with
:func:`require_kind`, which refuses an algorithm of another kind.

The hyperparameter contracts list read-only properties, so that a config dataclass whose
field is narrower (``batch_size: int`` where the contract reads ``int | None``) fits.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Protocol, TypeGuard, overload, runtime_checkable

import torch

from rlfleet.algos.base import Algorithm, AlgorithmKind
from rlfleet.data.rollout import RolloutStorage
from rlfleet.data.samplers import Sampler
from rlfleet.data.source import TransitionSource
from rlfleet.errors import ConfigError

# ----------------------------------------------------------------- hyperparameters


class OnPolicyHyperparameters(Protocol):
    """What :class:`~rlfleet.train.trainer.OnPolicyTrainer` and the multi-agent trainer read
    from an on-policy algorithm's config."""

    @property
    def num_steps(self) -> int:
        """Env steps per env in one rollout."""
        ...

    @property
    def batch_size(self) -> int | None:
        """Minibatch size (None: the whole rollout is one batch)."""
        ...

    @property
    def num_epochs(self) -> int | None:
        """Passes over each rollout (None: the algorithm's own scheme)."""
        ...

    @property
    def gamma(self) -> float:
        """Discount factor."""
        ...

    @property
    def gae_lambda(self) -> float:
        """GAE lambda (also of a multi-agent centralized critic's advantages)."""
        ...


class OffPolicyHyperparameters(Protocol):
    """What :class:`~rlfleet.train.trainer.OffPolicyTrainer` and the multi-agent trainer read
    from an off-policy algorithm's config (SB3 names)."""

    @property
    def buffer_size(self) -> int:
        """Transitions the replay buffer keeps."""
        ...

    @property
    def learning_starts(self) -> int:
        """Env steps of random actions, with no update, before learning starts."""
        ...

    @property
    def batch_size(self) -> int:
        """Minibatch size of each gradient step."""
        ...

    @property
    def train_freq(self) -> int:
        """Env steps per collection step."""
        ...

    @property
    def gradient_steps(self) -> int:
        """Gradient steps per collection step."""
        ...

    @property
    def gamma(self) -> float:
        """Discount factor."""
        ...

    @property
    def n_step(self) -> int:
        """Rewards summed into each sampled transition's return (1: one-step targets)."""
        ...


class OfflineHyperparameters(Protocol):
    """What :class:`~rlfleet.train.trainer.OfflineTrainer` reads from an offline algorithm's
    config."""

    @property
    def batch_size(self) -> int:
        """Minibatch size of each gradient step."""
        ...


class ActorLearnerHyperparameters(Protocol):
    """What :class:`~rlfleet.distributed.trainer.DistributedTrainer` reads from an
    actor-learner algorithm's config."""

    @property
    def num_steps(self) -> int:
        """Env steps per env in one actor fragment."""
        ...

    @property
    def batch_fragments(self) -> int:
        """Actor fragments per learner batch."""
        ...

    @property
    def batch_size(self) -> int | None:
        """Minibatch size (None: one gradient step on the whole learner batch)."""
        ...


# ---------------------------------------------------------------------- contracts


@runtime_checkable
class ImitationPolicy(Protocol):
    """A policy that can also learn to imitate demonstrated actions: what behavioral cloning
    beside the RL loss (:mod:`rlfleet.train.behavioral_cloning`) trains (PPO and SAC, as in
    ML-Agents). A capability, not a kind: algorithms meet it by having the two methods, and
    do not name it among their bases."""

    def imitation_loss(
        self, obs: torch.Tensor, actions: torch.Tensor, generator: torch.Generator
    ) -> torch.Tensor:
        """ML-Agents' behavioral-cloning loss of preprocessed observations and the actions
        demonstrated in them (action indices from 0 for Discrete spaces): the cross-entropy of
        the policy's action distribution for discrete actions, the mean squared error between
        an action sampled from the policy (reparameterised with ``generator``) and the
        demonstrated one for continuous actions."""
        ...

    def imitation_parameters(self) -> list[torch.nn.Parameter]:
        """The parameters the loss trains: the policy's, not the critic's."""
        ...


class OnPolicyAlgorithm(Protocol):
    """Learns from each fresh rollout, then discards it."""

    kind: ClassVar[Literal["on_policy"]]

    @property
    def config(self) -> OnPolicyHyperparameters:
        """The hyperparameters the trainer reads."""
        ...

    def update(
        self,
        rollout: RolloutStorage,
        /,
        *,
        batch_size: int | None = None,
        num_repetitions: int | None = None,
    ) -> dict[str, float]:
        """Learn from ``rollout``: ``num_repetitions`` passes over minibatches of
        ``batch_size`` (each defaults to the config's own); returns scalar metrics."""
        ...


class OffPolicyAlgorithm(Protocol):
    """Learns from minibatches it samples out of a replay buffer it does not own."""

    kind: ClassVar[Literal["off_policy"]]

    @property
    def config(self) -> OffPolicyHyperparameters:
        """The hyperparameters the trainer reads."""
        ...

    def update(
        self,
        source: TransitionSource,
        /,
        *,
        batch_size: int | None = None,
        num_gradient_steps: int = 1,
    ) -> dict[str, float]:
        """``num_gradient_steps`` gradient steps, each on a fresh minibatch of ``batch_size``
        (default: the config's) sampled from ``source``; returns scalar metrics."""
        ...

    def replay_sampler(self) -> Sampler:
        """How the replay buffer the trainer builds for it samples (prioritized replay for
        an algorithm that feeds back priorities, else uniform)."""
        ...


class OfflineAlgorithm(Protocol):
    """Learns from minibatches of a fixed dataset; never steps an env to learn."""

    kind: ClassVar[Literal["offline"]]

    @property
    def config(self) -> OfflineHyperparameters:
        """The hyperparameters the trainer reads."""
        ...

    def update(
        self,
        source: TransitionSource,
        /,
        *,
        batch_size: int | None = None,
        num_gradient_steps: int = 1,
    ) -> dict[str, float]:
        """``num_gradient_steps`` gradient steps, each on a fresh minibatch of ``batch_size``
        (default: the config's) sampled from ``source``; returns scalar metrics."""
        ...


class ActorLearnerAlgorithm(Protocol):
    """Learns on a learner from fragments that remote actors collected with older weights."""

    kind: ClassVar[Literal["distributed"]]

    @property
    def config(self) -> ActorLearnerHyperparameters:
        """The hyperparameters the trainer reads."""
        ...

    def update(self, batch: RolloutStorage, /) -> dict[str, float]:
        """Learn from the actor fragments gathered in ``batch``; returns scalar metrics."""
        ...


AnyKind = OnPolicyAlgorithm | OffPolicyAlgorithm | OfflineAlgorithm | ActorLearnerAlgorithm
_CONTRACTS: dict[AlgorithmKind, type[Any]] = {
    "on_policy": OnPolicyAlgorithm,
    "off_policy": OffPolicyAlgorithm,
    "offline": OfflineAlgorithm,
    "distributed": ActorLearnerAlgorithm,
}


def contract_of(kind: AlgorithmKind) -> type[Any]:
    """The contract class of ``kind``."""
    return _CONTRACTS[kind]


def declares_contract(cls: type[Any]) -> bool:
    """Whether ``cls`` names the contract of its ``kind`` among its bases."""
    return _CONTRACTS[cls.kind] in cls.__mro__


def is_on_policy(algorithm: Algorithm[Any]) -> TypeGuard[OnPolicyAlgorithm]:
    """An on-policy algorithm that declares :class:`OnPolicyAlgorithm`."""
    return algorithm.kind == "on_policy" and declares_contract(type(algorithm))


def is_off_policy(algorithm: Algorithm[Any]) -> TypeGuard[OffPolicyAlgorithm]:
    """An off-policy algorithm that declares :class:`OffPolicyAlgorithm`."""
    return algorithm.kind == "off_policy" and declares_contract(type(algorithm))


def is_offline(algorithm: Algorithm[Any]) -> TypeGuard[OfflineAlgorithm]:
    """An offline algorithm that declares :class:`OfflineAlgorithm`."""
    return algorithm.kind == "offline" and declares_contract(type(algorithm))


def is_actor_learner(algorithm: Algorithm[Any]) -> TypeGuard[ActorLearnerAlgorithm]:
    """An actor-learner algorithm that declares :class:`ActorLearnerAlgorithm`."""
    return algorithm.kind == "distributed" and declares_contract(type(algorithm))


@overload
def require_kind(
    algorithm: Algorithm[Any], kind: Literal["on_policy"], needs: str
) -> OnPolicyAlgorithm: ...
@overload
def require_kind(
    algorithm: Algorithm[Any], kind: Literal["off_policy"], needs: str
) -> OffPolicyAlgorithm: ...
@overload
def require_kind(
    algorithm: Algorithm[Any], kind: Literal["offline"], needs: str
) -> OfflineAlgorithm: ...
@overload
def require_kind(
    algorithm: Algorithm[Any], kind: Literal["distributed"], needs: str
) -> ActorLearnerAlgorithm: ...
def require_kind(algorithm: Algorithm[Any], kind: AlgorithmKind, needs: str) -> AnyKind:
    """``algorithm`` as the contract of ``kind``; refuses another kind with a ConfigError
    ``"<needs>, got <name> (<kind>)"``, and an algorithm that does not declare its kind's
    contract."""
    if kind == "on_policy" and is_on_policy(algorithm):
        return algorithm
    if kind == "off_policy" and is_off_policy(algorithm):
        return algorithm
    if kind == "offline" and is_offline(algorithm):
        return algorithm
    if kind == "distributed" and is_actor_learner(algorithm):
        return algorithm
    if algorithm.kind == kind:
        raise ConfigError(
            f"{needs}: {algorithm.name} says it is {kind} but does not declare "
            f"{_CONTRACTS[kind].__name__} among its bases"
        )
    raise ConfigError(f"{needs}, got {algorithm.name} ({algorithm.kind})")
