"""Shared RL math as plain functions, each tested against a hand-computed reference."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

if TYPE_CHECKING:
    from rlfleet.nn.deterministic import BoxBatch, DeterministicActorCritic


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


def horizon_cuts(
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    valid: torch.Tensor,
    time_horizon: int,
) -> torch.Tensor:
    """``[T, N]`` 1.0 at each step that closes a trajectory segment of ``time_horizon``
    steps, as ML-Agents cuts each agent's trajectory (its trainer setting ``time_horizon``).

    Per env, the steps are counted from the last cut, the last episode end or the start of
    the rollout (which the previous rollout closed), counting only ``valid`` steps; the
    ``time_horizon``-th step is a cut. Given to :func:`gae` as truncations, a cut stops the
    advantage recursion and bootstraps from the value of the observation that followed the
    step, which is how ML-Agents bootstraps a trajectory cut before its episode ended.
    """
    if time_horizon < 1:
        raise ValueError(f"time_horizon must be a positive integer, got {time_horizon}")
    done = torch.maximum(terminated, truncated) > 0
    counted = valid > 0
    cuts = torch.zeros_like(truncated)
    count = torch.zeros(terminated.shape[1:], dtype=torch.long, device=terminated.device)
    for t in range(terminated.shape[0]):
        count = count + counted[t].long()
        cut = counted[t] & (count >= time_horizon) & ~done[t]
        cuts[t] = cut.to(cuts.dtype)
        count = torch.where(cut | done[t], torch.zeros_like(count), count)
    return cuts


def vtrace(
    behaviour_log_probs: torch.Tensor,
    target_log_probs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lambda_: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace off-policy value targets and policy-gradient advantages (Espeholt et al. 2018,
    "IMPALA", arXiv:1802.01561, section 4).

    All inputs are ``[T, N]`` (time, env). The log-probabilities are of the taken actions under
    the behaviour policy ``mu`` (the actor's copy that collected the data) and the target
    policy ``pi`` (the learner's); ``values`` and ``next_values`` are the learner's estimates
    of the observation at step ``t`` and of the one that followed it, as in :func:`gae`.

    With ``rho_t = min(rho_bar, pi/mu)`` and ``c_t = lambda_ * min(c_bar, pi/mu)`` (the
    paper's remark 2: ``lambda_`` below 1 shortens the trace, as GAE's lambda does; on-policy,
    ``v_t`` is then the lambda-return)::

        delta_t = rho_t * (r_t + gamma * V(x_{t+1}) - V(x_t))
        v_t     = V(x_t) + delta_t + gamma * c_t * (v_{t+1} - V(x_{t+1}))
        A_t     = rho_t * (r_t + gamma * v_{t+1} - V(x_t))

    Episode ends follow the same contract as :func:`gae`: ``terminated`` zeroes the bootstrap;
    ``terminated or truncated`` cuts the recursion, and a truncated step bootstraps from
    ``next_values`` (its true final observation) since no trace continues past it. The last
    step's ``v_{t+1}`` is ``next_values[-1]``.

    Returns:
        ``(vs, advantages)``: value targets ``v_t`` and policy-gradient advantages ``A_t``.
    """
    ratios = (target_log_probs - behaviour_log_probs).exp()
    rhos = ratios.clamp(max=rho_bar)
    cs = ratios.clamp(max=c_bar)
    if lambda_ != 1.0:
        cs = cs * lambda_
    not_terminated = 1.0 - terminated.float()
    not_done = 1.0 - torch.maximum(terminated.float(), truncated.float())
    deltas = rhos * (rewards + gamma * not_terminated * next_values - values)
    corrections = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = deltas[t] + gamma * cs[t] * not_done[t] * running
        corrections[t] = running
    vs = values + corrections
    following_vs = torch.cat([vs[1:], next_values[-1:]], dim=0)
    next_vs = torch.where(not_done.bool(), following_vs, next_values)
    advantages = rhos * (rewards + gamma * not_terminated * next_vs - values)
    return vs, advantages


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - predicted) / Var(target); 1 is perfect, 0 no better than a constant."""
    var_target = torch.var(target)
    if float(var_target) == 0.0:
        return float("nan")
    return float(1.0 - torch.var(target - predicted) / var_target)


def weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` weighted by ``weights`` (0/1 masks), safe when all weights are 0."""
    return (values * weights).sum() / weights.sum().clamp(min=1.0)


def n_step_return(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    available: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n-step returns of transitions, each given with the ``n`` steps that follow it.

    All inputs are ``[batch, n]``: column ``k`` is step ``t + k`` after the sampled step
    ``t``. Step ``k`` counts when steps ``0..k`` are ``available`` (stored, real
    transitions; column 0 always is) and no episode ended at a step before ``k``: the sum
    stops at an episode end, so no reward of the next episode leaks in.

    Terminated and truncated differ only in the bootstrap: after ``terminated`` the
    discount is 0; after ``truncated`` (a time limit) it is ``gamma ** m`` and the target
    bootstraps from the episode's true final observation (Pardo et al. 2018, "Time Limits
    in Reinforcement Learning").

    Returns:
        ``(returns, discounts, num_steps)``: ``sum_k gamma**k r_k`` over the counted steps,
        the bootstrap factor of the value of the observation after them, and how many steps
        ``m`` were counted (the next observation is ``m`` steps after the sampled one).
    """
    done = torch.maximum(terminated.float(), truncated.float())
    # A step counts if nothing ended before it: shift the running "still alive" product.
    alive_before = torch.cumprod(1.0 - done, dim=1)
    alive_before = torch.cat([torch.ones_like(alive_before[:, :1]), alive_before[:, :-1]], dim=1)
    counted = alive_before * torch.cumprod(available.float(), dim=1)
    n = rewards.shape[1]
    powers = gamma ** torch.arange(n, dtype=rewards.dtype)
    returns = (rewards * counted * powers).sum(1)
    num_steps = counted.sum(1).long()
    last_terminated = terminated.float().gather(1, (num_steps - 1).unsqueeze(1)).squeeze(1)
    discounts = (gamma ** num_steps.to(rewards.dtype)) * (1.0 - last_terminated)
    return returns, discounts, num_steps


def polyak_update(target: list[torch.Tensor], online: list[torch.Tensor], tau: float) -> None:
    """``target <- (1 - tau) * target + tau * online`` in place, for all tensors at once.

    ``tau = 1`` is a hard copy (DQN's periodic target update); a small ``tau`` is the
    soft update of DDPG/TD3/SAC (Lillicrap et al. 2016, arXiv:1509.02971). One foreach
    kernel per call instead of one per parameter.
    """
    with torch.no_grad():
        if tau == 1.0:
            torch._foreach_copy_(target, online)
        else:
            torch._foreach_lerp_(target, online, tau)


def twin_q_loss(q: tuple[torch.Tensor, torch.Tensor], target: torch.Tensor) -> torch.Tensor:
    """Sum of the mean squared errors of twin critics' ``[batch, 1]`` values against one
    ``[batch]`` target (TD3, IQL, CQL; SAC halves it, as Stable-Baselines3 does)."""
    q1, q2 = q
    return nn.functional.mse_loss(q1.squeeze(1), target) + nn.functional.mse_loss(
        q2.squeeze(1), target
    )


def smoothed_target_actions(
    actions: torch.Tensor, noise_std: float, noise_clip: float, noise: torch.Tensor
) -> torch.Tensor:
    """Target-policy smoothing (Fujimoto et al. 2018, arXiv:1802.09477, section 5.3): actions
    in [-1, 1] plus Gaussian noise of std ``noise_std`` clipped to ``[-noise_clip,
    noise_clip]``, clipped back into [-1, 1], so the critic's target averages Q over
    similar actions instead of fitting a narrow peak. ``noise``: a standard-normal draw of
    the actions' shape."""
    noise = (noise * noise_std).clamp(-noise_clip, noise_clip)
    return (actions + noise).clamp(-1.0, 1.0)


class TargetSmoothing(Protocol):
    """The settings of :func:`smoothed_target_actions`, as TD3's and TD3+BC's configs name them."""

    @property
    def target_policy_noise(self) -> float:
        """Std of the smoothing noise on target actions (in units of half the action range)."""

    @property
    def target_noise_clip(self) -> float:
        """Clip of that smoothing noise."""


def td3_critic_loss(
    nets: DeterministicActorCritic,
    batch: BoxBatch,
    smoothing: TargetSmoothing,
) -> torch.Tensor:
    """TD3's critic loss (Fujimoto et al. 2018, arXiv:1802.09477, section 5): both critics of
    ``nets`` (built with ``twin``) regress onto the clipped double-Q target
    ``r + discount * min(Q'_1, Q'_2)(s', a')`` at the smoothed target action
    ``a' = smoothed_target_actions(mu'(s'))``, with the batch's ``next_noise`` as the
    smoothing's standard-normal draw; the minimum counters overestimation.
    """
    assert batch.next_noise is not None, "TD3's critic loss smooths with the batch's next_noise"
    with torch.no_grad():
        next_obs = batch.next_obs
        next_actions = smoothed_target_actions(
            nets.target_policy(next_obs),
            smoothing.target_policy_noise,
            smoothing.target_noise_clip,
            batch.next_noise,
        )
        next_q1, next_q2 = nets.critic_target(torch.cat([next_obs, next_actions], 1))
        target = batch.rewards + batch.discounts * torch.min(next_q1, next_q2).squeeze(1)
    return twin_q_loss(nets.critic(torch.cat([batch.obs, batch.actions], 1)), target)


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """Asymmetric squared error ``|expectile - 1(diff < 0)| * diff^2``, elementwise.

    Minimising its mean over ``diff = target - prediction`` fits the ``expectile`` of the
    target (0.5: the mean; towards 1: the maximum), IQL's value loss (Kostrikov et al. 2021,
    "Offline Reinforcement Learning with Implicit Q-Learning", arXiv:2110.06169, eq. 5).
    """
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return weight * diff.pow(2)


def standardize(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``values`` shifted and scaled to weighted mean 0 and standard deviation 1."""
    mean = weighted_mean(values, weights)
    std = weighted_mean((values - mean).pow(2), weights).sqrt()
    return (values - mean) / (std + 1e-8)


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
