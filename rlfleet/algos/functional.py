"""Shared RL math as plain functions, each tested against a hand-computed reference."""

from __future__ import annotations

from collections.abc import Callable

import torch


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    All inputs are ``[T, N]`` (time, env). ``next_values[t]`` is the value of the
    observation that followed step ``t`` — for a truncated episode, the value of its true
    final observation, which is how a timeout bootstraps instead of being treated as a
    terminal state (Pardo et al. 2018, "Time Limits in Reinforcement Learning").

    ``terminated`` zeroes the bootstrap; ``terminated or truncated`` cuts the
    advantage recursion so no credit flows across an episode boundary.

    Returns:
        ``(advantages, returns)`` where ``returns = advantages + values``.
    """
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - torch.maximum(terminated.float(), truncated.float())
    deltas = rewards + gamma * next_values * not_terminated - values
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[0])
    decay = gamma * gae_lambda
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + decay * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + values


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - predicted) / Var(target); 1 is perfect, 0 no better than a constant."""
    var_target = torch.var(target)
    if float(var_target) == 0.0:
        return float("nan")
    return float(1.0 - torch.var(target - predicted) / var_target)


def weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` weighted by ``weights`` (0/1 masks), safe when all weights are 0."""
    return (values * weights).sum() / weights.sum().clamp(min=1.0)


def standardize(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``values`` shifted and scaled to weighted mean 0 and standard deviation 1."""
    mean = weighted_mean(values, weights)
    std = weighted_mean((values - mean).pow(2), weights).sqrt()
    return (values - mean) / (std + 1e-8)


def clip_grad_norm(parameters: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale gradients in place so their global L2 norm is at most ``max_norm``.

    The maths of :func:`torch.nn.utils.clip_grad_norm_`, without its per-call argument
    checks and dispatch, which cost as much as the arithmetic for the few small tensors of
    an RL network. Returns the norm before clipping.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm  # type: ignore[no-any-return]


def conjugate_gradient(
    matrix_vector: Callable[[torch.Tensor], torch.Tensor],
    b: torch.Tensor,
    max_steps: int,
    tolerance: float = 1e-10,
) -> torch.Tensor:
    """Approximately solve ``A x = b`` for a symmetric positive-definite ``A`` given only as
    the product ``matrix_vector(v) = A v`` (Hestenes and Stiefel 1952; Nocedal and Wright,
    "Numerical Optimization", algorithm 5.2). Stops after ``max_steps`` products or when
    the squared residual falls below ``tolerance``. Starts from ``x = 0``.
    """
    x = torch.zeros_like(b)
    residual = b.clone()
    direction = b.clone()
    residual_sq = residual.dot(residual)
    for _ in range(max_steps):
        if float(residual_sq) < tolerance:
            break
        product = matrix_vector(direction)
        alpha = residual_sq / direction.dot(product)
        x += alpha * direction
        residual -= alpha * product
        new_residual_sq = residual.dot(residual)
        direction = residual + (new_residual_sq / residual_sq) * direction
        residual_sq = new_residual_sq
    return x


def retrace(
    rewards: torch.Tensor,
    q_taken: torch.Tensor,
    values: torch.Tensor,
    rho_bar: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """Retrace Q targets with lambda = 1 (Munos et al. 2016, arXiv:1606.02647), as ACER uses
    them (Wang et al. 2017, arXiv:1611.01224, eq. 5).

    Inputs are ``[T, N]`` except ``values``, ``[T + 1, N]``: the state values of every row
    and of the observation after the last one. Backwards from ``Q_ret = V(x_T)``::

        Q_ret(t) = r_t + gamma * Q_ret(t + 1)
        Q_ret(t + 1) for t - 1 = rho_bar_t * (Q_ret(t) - Q(x_t, a_t)) + V(x_t)

    where ``rho_bar_t = min(1, pi(a_t|x_t) / mu(a_t|x_t))``. At an episode end the
    recursion is cut: a terminated step bootstraps from 0, a truncated one from the value
    of its final observation, which next-step autoreset stores in the next row.
    """
    targets = torch.empty_like(rewards)
    q_ret = values[-1]
    not_done = 1.0 - torch.maximum(terminated, truncated).float()
    timeout = truncated.float() * (1.0 - terminated.float())
    for t in range(rewards.shape[0] - 1, -1, -1):
        bootstrap = not_done[t] * q_ret + timeout[t] * values[t + 1]
        q_ret = rewards[t] + gamma * bootstrap
        targets[t] = q_ret
        q_ret = rho_bar[t] * (q_ret - q_taken[t]) + values[t]
    return targets
