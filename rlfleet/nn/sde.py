"""Generalized state-dependent exploration (gSDE): Raffin, Kober and Stulp 2022, "Smooth
Exploration for Robotic Reinforcement Learning" (CoRL 2021, arXiv:2005.05719).

A Gaussian policy that explores with gSDE adds to its mean action ``mu(s)`` the noise
``z(s) @ E``: ``z(s)`` are the actor's last hidden features (without their gradient) and
``E`` is a ``[features, action dims]`` exploration matrix with entries drawn from
``N(0, sigma**2)``, ``sigma = exp(log_std)`` a learned matrix of the same shape. ``E`` is
held for ``sde_sample_freq`` steps (or a whole rollout), so the noise changes only as the
state does: the same state gives the same perturbation, and a smooth trajectory a smooth
one. Given the state, the action is Gaussian, with variance ``z(s)**2 @ sigma**2`` in each
action dimension, and that is the distribution whose log-probabilities and entropies the
loss uses. Stable-Baselines3 calls the same settings ``use_sde`` and ``sde_sample_freq``
(with ``full_std`` and without ``use_expln`` or ``learn_features``, its defaults), and
RL-Baselines3-Zoo's A2C, PPO and TRPO sets on Pendulum, MountainCarContinuous,
LunarLanderContinuous and BipedalWalker rely on it.

Written here rather than taken from Stable-Baselines3's ``StateDependentNoiseDistribution``:
that one draws the matrices from torch's global random state through
``torch.distributions``. Here the standard-normal draws of period ``k`` come from a
generator seeded by ``(seed, k)``, as :mod:`rlfleet.nn.noise` does for colored noise, so
the whole state of the process is one step counter that a checkpoint keeps, and a resumed
run explores with the same matrices.
"""

from __future__ import annotations

import torch

from rlfleet.nn.noise import indexed_generator

SDE_VARIANCE_FLOOR = 1e-6
"""Added to the state-dependent variance, so that features of zero still give a proper
distribution (Stable-Baselines3's ``epsilon``)."""


def sde_log_std(latent: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Per-row log standard deviations ``[batch, action dims]`` of a gSDE policy from its
    features ``latent`` ``[batch, features]`` and its ``[features, action dims]`` matrix
    ``log_std``; the features carry no gradient through this (only ``log_std`` learns)."""
    variance = latent.detach().pow(2) @ torch.exp(2.0 * log_std)
    return 0.5 * torch.log(variance + SDE_VARIANCE_FLOOR)


class StateDependentNoise:
    """Exploration matrices of a gSDE policy, one per env, redrawn every ``period`` steps.

    :meth:`perturbation` gives each env's ``z(s) @ E`` for one step. Its whole state is
    :attr:`step`, which the algorithm's checkpoint keeps.
    """

    def __init__(self, latent_dim: int, action_dim: int, seed: int, period: int) -> None:
        self.latent_dim = latent_dim
        self.action_dim = action_dim
        self.seed = seed
        self.period = period
        """Steps each draw of matrices is held for."""
        self.step = 0
        """Steps acted so far."""
        self._draws: torch.Tensor | None = None
        self._draws_key: tuple[int, int] = (-1, -1)

    def perturbation(self, latent: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
        """``z(s) @ E`` ``[num_envs, action dims]`` for one step of ``num_envs`` envs (the
        rows of ``latent``), with ``E = sigma * draws`` of the current period; advances the
        step."""
        num_envs = latent.shape[0]
        index = self.step // self.period
        if self._draws is None or self._draws_key != (index, num_envs):
            shape = (num_envs, self.latent_dim, self.action_dim)
            draws = torch.randn(shape, generator=indexed_generator(self.seed, index))
            self._draws = draws.to(latent.device)
            self._draws_key = (index, num_envs)
        self.step += 1
        matrices = self._draws * log_std.exp()
        return torch.bmm(latent.unsqueeze(1), matrices).squeeze(1)
