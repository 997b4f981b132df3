"""Several learners that train one model together by averaging their gradients.

With ``num_learners > 1`` the trainer starts that many :class:`LearnerWorker` Ray actors (on
GPU nodes when ``learner_num_gpus`` is set). They form a ``torch.distributed`` process group
(the gloo backend, which runs on CPUs and between nodes; learner 0 hosts the rendezvous).
Every update, each learner receives its own ``batch_fragments`` fragments straight from the
object store and runs the algorithm's unchanged :meth:`~rlfleet.algos.base.Algorithm.update`;
a :class:`GradientAverager` hooked onto the parameters all-reduces the gradients after every
backward pass, before clipping, the non-finite check and the optimiser step. All learners
start from the same
state and apply the same averaged gradients, so their weights stay identical: data-parallel
SGD with an effective batch of ``num_learners x batch_fragments`` fragments. Learner 0's
weights are the ones broadcast to the actors and saved in checkpoints. Observation statistics
(``normalize_obs``) stay identical the same way: each learner folds the observations of every
learner's batch (an all-gather, :func:`gather_rows`) into its own copy.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from gymnasium import spaces
from torch import nn

from rlfleet.algos.base import Algorithm
from rlfleet.algos.kinds import ActorLearnerAlgorithm, require_kind
from rlfleet.algos.policy_gradient import LearnerObsStats
from rlfleet.algos.registry import get_algorithm
from rlfleet.data.rollout import RolloutStorage
from rlfleet.distributed.actors import PolicyWeights, policy_weights
from rlfleet.errors import ClusterError
from rlfleet.nn.optim import NanPolicy
from rlfleet.rewards.signals import RewardSignals

GROUP_TIMEOUT = timedelta(minutes=5)
"""How long a collective waits for the other learners before failing instead of hanging."""


class GradientAverager:
    """Averages the gradients of ``parameters`` across the process group after each backward.

    Post-accumulate-grad hooks count the parameters whose gradient is complete; once all
    are, one all-reduce over their concatenation replaces each gradient by the group's mean.
    Every backward must reach every parameter (true of the actor-critic losses here), so all
    learners join the same collectives in the same order.
    """

    def __init__(self, parameters: Iterable[nn.Parameter], world_size: int) -> None:
        self.params = [p for p in parameters if p.requires_grad]
        self.world_size = world_size
        self._complete = 0
        for param in self.params:
            param.register_post_accumulate_grad_hook(self._on_grad)

    def _on_grad(self, _: torch.Tensor) -> None:
        self._complete += 1
        if self._complete < len(self.params):
            return
        self._complete = 0
        grads = [p.grad for p in self.params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def learner_step(
    learner: ActorLearnerAlgorithm,
    batch: RolloutStorage,
    fragments: Sequence[RolloutStorage],
    reward_signals: RewardSignals | None = None,
) -> dict[str, float]:
    """One learner update: the fragments side by side in ``batch``, their rewards replaced
    by the combined reward of ``reward_signals`` (pre-training: the intrinsic reward alone),
    then ``learner.update(batch)``; returns the update's and the signals' metrics.

    The signals see each batch once, one pass of minibatches as large as the batch. Only an
    intrinsic signal's mean reward per step is logged, not its per-episode return: the
    fragments of one episode land in different batch columns from update to update.
    """
    for k, fragment in enumerate(fragments):
        batch.copy_envs_from(fragment, k * fragment.num_envs)
    signal_metrics: dict[str, float] = {}
    if reward_signals is not None and not reward_signals.is_identity:
        found = reward_signals.process_rollout(
            batch,
            batch.next_obs,
            batch_size=batch.num_steps * batch.num_envs,
            num_epochs=1,
        )
        signal_metrics = {
            k: v
            for k, v in found.items()
            if not (k.startswith("train/intrinsic_") and k.endswith("_return"))
        }
    return {**learner.update(batch), **signal_metrics}


@dataclass(frozen=True)
class LearnerSpec:
    """Everything a learner actor needs to build its copy of the algorithm."""

    algo: str
    hyperparameters: Any
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    seed: int
    device: str
    th_compile: bool
    nan_policy: NanPolicy = "raise"
    """The trainer's ``nan_policy``, which each learner's copy follows."""


@dataclass(frozen=True)
class UpdateResult:
    """One learner's update: its metrics, and its gradient-step and skipped-batch counters
    afterwards."""

    metrics: dict[str, float]
    gradient_steps: int
    skipped_batches: int


class LearnerWorker:
    """The body of one learner actor (wrapped by ``ray.remote`` on the driver)."""

    def __init__(self, rank: int, world_size: int, spec: LearnerSpec) -> None:
        torch.set_num_threads(1)
        self.rank = rank
        self.world_size = world_size
        self.algorithm: Algorithm[Any] = get_algorithm(spec.algo)(
            spec.observation_space,
            spec.action_space,
            spec.hyperparameters,
            seed=spec.seed,
            device=spec.device,
        )
        self.actor_learner = require_kind(
            self.algorithm, "distributed", "a learner needs an actor-learner algorithm"
        )
        """The algorithm as its kind's contract: what :meth:`update` calls."""
        self.algorithm.nan_policy = spec.nan_policy
        if spec.th_compile:
            self.algorithm.compile_update()
        self.batch: RolloutStorage | None = None

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port for the process group's rendezvous."""
        import ray

        with socket.socket() as sock:
            sock.bind(("", 0))
            port = int(sock.getsockname()[1])
        return ray.util.get_node_ip_address(), port

    def join(self, host: str, port: int) -> None:
        """Join the process group (blocks until every learner has joined)."""
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{host}:{port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=GROUP_TIMEOUT,
        )
        params = (p for module in self.algorithm.modules().values() for p in module.parameters())
        self.averager = GradientAverager(params, self.world_size)
        obs_stats = getattr(self.algorithm, "obs_stats", None)
        if isinstance(obs_stats, LearnerObsStats):
            obs_stats.gather = gather_rows

    def load_state(self, state: dict[str, Any]) -> None:
        self.algorithm.load_state_dict(state)

    def state(self) -> dict[str, Any]:
        """The full state with every tensor on the CPU, so a driver without a GPU can load it."""
        state: dict[str, Any] = _to_cpu(self.algorithm.state_dict())
        return state

    def update(
        self, version: int, progress: float, *fragments: RolloutStorage
    ) -> tuple[UpdateResult, PolicyWeights | None]:
        """Update on these fragments side by side; learner 0 also returns the new weights."""
        if self.batch is None:
            first = fragments[0]
            self.batch = RolloutStorage(
                first.num_steps,
                first.num_envs * len(fragments),
                tuple(first.obs.shape[2:]),
                tuple(first.actions.shape[2:]),
                obs_dtype=first.obs.dtype,
                action_dtype=first.actions.dtype,
                state_shape=None if first.states is None else tuple(first.states.shape[2:]),
            )
        for k, fragment in enumerate(fragments):
            self.batch.copy_envs_from(fragment, k * fragment.num_envs)
        self.algorithm.set_progress(progress)
        metrics = self.actor_learner.update(self.batch)
        weights = policy_weights(self.algorithm, version) if self.rank == 0 else None
        result = UpdateResult(
            metrics, self.algorithm.gradient_steps, self.algorithm.skipped_batches
        )
        return result, weights


def gather_rows(rows: torch.Tensor) -> torch.Tensor:
    """Every learner's ``rows``, rank by rank (all learners' batches have the same shape)."""
    parts = [torch.empty_like(rows) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, rows.contiguous())
    return torch.cat(parts)


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


class LearnerGroup:
    """The driver's handle on the learner actors."""

    def __init__(
        self, ray: Any, spec: LearnerSpec, *, num_learners: int, num_cpus: float, num_gpus: float
    ) -> None:
        self.ray = ray
        remote = ray.remote(LearnerWorker).options(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0
        )
        self.handles = [remote.remote(rank, num_learners, spec) for rank in range(num_learners)]
        host, port = self._get(self.handles[0].rendezvous_address.remote())
        self._get([handle.join.remote(host, port) for handle in self.handles])

    def _get(self, refs: Any) -> Any:
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayError as err:
            raise ClusterError(f"a learner failed: {err}") from None

    def load_state(self, state: dict[str, Any]) -> None:
        """Give every learner the same full state (weights, optimiser, RNG, counters)."""
        ref = self.ray.put(state)
        self._get([handle.load_state.remote(ref) for handle in self.handles])

    def state(self) -> dict[str, Any]:
        """Learner 0's full state (all learners hold the same weights)."""
        state: dict[str, Any] = self._get(self.handles[0].state.remote())
        return state

    def update(
        self, version: int, progress: float, fragment_refs: list[Any]
    ) -> tuple[dict[str, float], UpdateResult, Any]:
        """Split the fragments evenly, update all learners; returns the mean metrics (each
        over the learners that report it: a skipped batch reports fewer), learner 0's result
        (its counters) and an object ref to learner 0's new weights."""
        per = len(fragment_refs) // len(self.handles)
        calls = [
            handle.update.options(num_returns=2).remote(
                version, progress, *fragment_refs[rank * per : (rank + 1) * per]
            )
            for rank, handle in enumerate(self.handles)
        ]
        results: list[UpdateResult] = self._get([result for result, _ in calls])
        metrics: dict[str, float] = {}
        for key in dict.fromkeys(k for r in results for k in r.metrics):
            values = [r.metrics[key] for r in results if key in r.metrics]
            metrics[key] = sum(values) / len(values)
        return metrics, results[0], calls[0][1]

    def shutdown(self) -> None:
        for handle in self.handles:
            self.ray.kill(handle, no_restart=True)
