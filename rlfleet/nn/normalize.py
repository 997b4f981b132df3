"""Running mean/std normalisation whose statistics live in the model's state dict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rlfleet.errors import ConfigError
from rlfleet.nn.obs import ObsLayout


class RunningNormalizer(nn.Module):
    """Normalises inputs with running statistics (parallel Welford update, Chan et al. 1979).

    Statistics are buffers, so they are saved and restored with the algorithm and frozen
    whenever :meth:`update` is not called (evaluation and play).
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.clip = clip
        self.epsilon = epsilon
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Fold a ``[batch, *shape]`` tensor into the statistics."""
        batch = batch.double()
        batch_mean = batch.mean(0)
        batch_var = batch.var(0, unbiased=False)
        n = batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean += delta * n / total
        self.var.copy_(
            (self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total) / total
        )
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(self.var + self.epsilon).to(x.dtype)
        return ((x - self.mean.to(x.dtype)) * scale).clamp(-self.clip, self.clip)


class RewardScaler(nn.Module):
    """Divides rewards by the running standard deviation of the discounted return.

    Stable-Baselines3's ``VecNormalize`` reward normalisation (see Engstrom et al. 2020,
    "Implementation Matters in Deep Policy Gradients", arXiv:2005.12729): per env a
    discounted return ``R = gamma * R + r`` is accumulated and zeroed at episode ends;
    rewards are divided by ``sqrt(Var[R] + epsilon)`` and clipped to ``[-clip, clip]``.
    The mean is not subtracted, so the sign of every reward is kept.

    Deviation: statistics are folded in once per rollout, then the whole rollout is scaled
    with them, where SB3 updates and scales step by step. Reset steps (``valid`` 0) add no
    sample. The statistics and the per-env running return (the ``running_return`` buffer,
    empty until the first update) are saved with the model, so that a resumed run whose
    envs continue their episodes (see :mod:`rlfleet.envs.state`) continues their returns
    too; SB3 saves no running return.
    """

    running_return: torch.Tensor

    def __init__(self, gamma: float, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.gamma = gamma
        self.clip = clip
        self.epsilon = epsilon
        self.return_stats = RunningNormalizer(())
        self.register_buffer("running_return", torch.zeros(0, dtype=torch.float64))

    def _load_from_state_dict(
        self,
        state_dict: Mapping[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        """Load as any module, except that ``running_return`` takes the saved one's shape
        (one entry per env of the run that saved it), and a state without one (saved before
        the running return was) leaves it empty: the next update starts it at zero."""
        key = prefix + "running_return"
        saved = state_dict.get(key)
        shape = saved.shape if isinstance(saved, torch.Tensor) else (0,)
        self.running_return = torch.zeros(
            shape, dtype=torch.float64, device=self.running_return.device
        )
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        if saved is None and key in missing_keys:
            missing_keys.remove(key)

    @torch.no_grad()
    def forward(
        self, rewards: torch.Tensor, done: torch.Tensor, valid: torch.Tensor, *, update: bool
    ) -> torch.Tensor:
        """Scaled ``[T, N]`` rewards; with ``update``, first fold this rollout's returns in."""
        if update:
            if self.running_return.shape != rewards.shape[1:]:
                self.running_return = torch.zeros(
                    rewards.shape[1:], dtype=torch.float64, device=rewards.device
                )
            returns = torch.empty_like(rewards, dtype=torch.float64)
            not_done = 1.0 - done.double()
            # On the rollout's device: a model on an accelerator scales CPU rollouts.
            running = self.running_return.to(rewards.device)
            for t in range(rewards.shape[0]):
                running = running * self.gamma + rewards[t]
                returns[t] = running
                running = running * not_done[t]
            self.running_return = running
            samples = returns[valid.bool()]
            if samples.numel():
                self.return_stats.update(samples)
        scale = torch.rsqrt(self.return_stats.var + self.epsilon).to(rewards.dtype)
        return (rewards * scale).clamp(-self.clip, self.clip)


def make_obs_normalizer(
    layout: ObsLayout, enabled: bool, algo: str, device: torch.device | str = "cpu"
) -> RunningNormalizer | None:
    """A normaliser for float observations when ``enabled``, on ``device`` (ConfigError for
    image ones)."""
    if not enabled:
        return None
    if layout.dtype != torch.float32:
        raise ConfigError(
            f"{algo}: normalize_obs applies to vector observations; these contain images, "
            "which the CNN encoder scales to [0, 1] instead (set normalize_obs: false)"
        )
    return RunningNormalizer(layout.shape).to(device)


def obs_normalizer_modules(normalizer: RunningNormalizer | None) -> dict[str, nn.Module]:
    """The ``modules()`` entry of an observation normaliser (none without one), under the
    name every algorithm saves it by."""
    return {} if normalizer is None else {"obs_normalizer": normalizer}


def normalize_obs(
    normalizer: RunningNormalizer | None, obs: torch.Tensor, *, update_stats: bool
) -> torch.Tensor:
    """``obs`` normalised (statistics first updated with it when ``update_stats``)."""
    if normalizer is None:
        return obs
    if update_stats:
        normalizer.update(obs)
    normalized: torch.Tensor = normalizer(obs)
    return normalized
