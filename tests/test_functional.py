"""Shared math against hand-computed references."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet.algos.td3 import TD3Config
from rlfleet.functional import (
    explained_variance,
    gae,
    horizon_cuts,
    n_step_return,
    polyak_update,
    smoothed_target_actions,
    td3_critic_loss,
    twin_q_loss,
    vtrace,
    weighted_mean,
)
from rlfleet.nn.deterministic import BoxBatch, DeterministicActorCritic


def test_gae_matches_hand_computation_with_termination_and_truncation() -> None:
    # One env, five steps, gamma 0.9, lambda 0.5.
    # t=0: mid-episode; t=1: terminated; t=2: reset step (first obs of a new episode);
    # t=3: truncated by a time limit whose final observation is worth 2.0; t=4: mid-episode.
    gamma, lam = 0.9, 0.5
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0], [1.0]])
    values = torch.tensor([[0.5], [0.4], [7.0], [0.2], [0.1]])
    next_values = torch.tensor([[0.4], [7.0], [0.2], [2.0], [0.3]])
    terminated = torch.tensor([[0.0], [1.0], [0.0], [0.0], [0.0]])
    truncated = torch.tensor([[0.0], [0.0], [0.0], [1.0], [0.0]])

    # By hand, backwards:
    # t=4: delta = 1 + 0.9*0.3 - 0.1 = 1.17;                      A4 = 1.17
    # t=3: delta = 3 + 0.9*2.0 - 0.2 = 4.6 (bootstrap on timeout); A3 = 4.6 (episode cut)
    # t=2: delta = 0 + 0.9*0.2 - 7.0 = -6.82;                     A2 = -6.82 + 0.45*4.6 = -4.75
    # t=1: delta = 2 + 0 - 0.4 = 1.6 (terminal: no bootstrap);     A1 = 1.6 (episode cut)
    # t=0: delta = 1 + 0.9*0.4 - 0.5 = 0.86;                      A0 = 0.86 + 0.45*1.6 = 1.58
    expected = torch.tensor([[1.58], [1.6], [-4.75], [4.6], [1.17]])
    advantages, returns = gae(rewards, values, next_values, terminated, truncated, gamma, lam)
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)


def test_gae_envs_are_independent() -> None:
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    values = torch.zeros(2, 2)
    next_values = torch.zeros(2, 2)
    done = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    advantages, _ = gae(rewards, values, next_values, done, torch.zeros(2, 2), 1.0, 1.0)
    # env 0: A1 = 1, A0 = 1 + 1 = 2; env 1 terminates at t=0: A0 = 0, A1 = 1.
    torch.testing.assert_close(advantages, torch.tensor([[2.0, 0.0], [1.0, 1.0]]))


def test_horizon_cuts_count_valid_steps_since_the_last_cut_or_episode_end() -> None:
    # Env 0: an episode ends at t=1 (no cut: it already ends there), t=2 is the reset step
    # (not counted), then t=3, t=4 make a segment of 2: a cut at t=4.
    # Env 1: no episode end: cuts at t=1, t=3 and t=5.
    terminated = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0],
                               [0.0, 0.0]])  # fmt: skip
    valid = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0],
                          [1.0, 1.0]])  # fmt: skip
    cuts = horizon_cuts(terminated, torch.zeros(6, 2), valid, 2)
    expected = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [1.0, 0.0],
                             [0.0, 1.0]])  # fmt: skip
    torch.testing.assert_close(cuts, expected)
    assert not horizon_cuts(terminated, torch.zeros(6, 2), valid, 7).any()
    with pytest.raises(ValueError, match="time_horizon"):
        horizon_cuts(terminated, torch.zeros(6, 2), valid, 0)


def test_gae_cut_by_a_time_horizon_matches_hand_computation() -> None:
    # One env, four steps of one episode, gamma 0.5, lambda 1, time horizon 2: two segments,
    # [0, 1] bootstrapped from V(s2) = 0.5 and [2, 3] from V(s4) = 2.0.
    rewards = torch.ones(4, 1)
    values = torch.full((4, 1), 0.5)
    next_values = torch.tensor([[0.5], [0.5], [0.5], [2.0]])
    zeros = torch.zeros(4, 1)
    cuts = horizon_cuts(zeros, zeros, torch.ones(4, 1), 2)
    advantages, returns = gae(rewards, values, next_values, zeros, cuts, 0.5, 1.0)
    # By hand (lambda 1: discounted rewards of the segment + bootstrap - V):
    # A3 = 1 + 0.5*2.0 - 0.5 = 1.5;        A2 = 1 + 0.5*1 + 0.25*2.0 - 0.5 = 1.5
    # A1 = 1 + 0.5*0.5 - 0.5 = 0.75 (cut); A0 = 1 + 0.5*1 + 0.25*0.5 - 0.5 = 1.125
    expected = torch.tensor([[1.125], [0.75], [1.5], [1.5]])
    torch.testing.assert_close(advantages, expected)
    torch.testing.assert_close(returns, expected + values)
    # Uncut, credit flows over the whole rollout: A0 = 1 + 0.5 + 0.25 + 0.125 + 0.0625*2 - 0.5.
    uncut, _ = gae(rewards, values, next_values, zeros, zeros, 0.5, 1.0)
    torch.testing.assert_close(uncut[0], torch.tensor([1.5]))


def test_weighted_mean_ignores_masked_entries_and_survives_empty_mask() -> None:
    values = torch.tensor([1.0, 100.0, 3.0])
    assert float(weighted_mean(values, torch.tensor([1.0, 0.0, 1.0]))) == pytest.approx(2.0)
    assert float(weighted_mean(values, torch.zeros(3))) == 0.0


def test_explained_variance() -> None:
    target = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(target, target) == pytest.approx(1.0)
    assert explained_variance(torch.full((3,), 2.0), target) == pytest.approx(0.0)


def test_vtrace_matches_hand_computation_with_termination_and_truncation() -> None:
    # The episode layout of the GAE test: t=1 terminated, t=2 the reset step, t=3 truncated
    # with a final observation worth 2.0. gamma 0.9, rho_bar 1.0, c_bar 0.8; pi/mu ratios
    # [2, 0.5, 1, 0.5, 1] -> rho = [1, 0.5, 1, 0.5, 1], c = [0.8, 0.5, 0.8, 0.5, 0.8].
    gamma = 0.9
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0], [1.0]])
    values = torch.tensor([[0.5], [0.4], [7.0], [0.2], [0.1]])
    next_values = torch.tensor([[0.4], [7.0], [0.2], [2.0], [0.3]])
    terminated = torch.tensor([[0.0], [1.0], [0.0], [0.0], [0.0]])
    truncated = torch.tensor([[0.0], [0.0], [0.0], [1.0], [0.0]])
    behaviour = torch.zeros(5, 1)
    target = torch.log(torch.tensor([[2.0], [0.5], [1.0], [0.5], [1.0]]))

    # deltas = rho * (r + gamma * V' * not_terminated - V):
    #   t0: 1 * (1 + 0.9*0.4 - 0.5) = 0.86     t1: 0.5 * (2 - 0.4) = 0.8 (terminal)
    #   t2: 1 * (0 + 0.9*0.2 - 7) = -6.82      t3: 0.5 * (3 + 0.9*2.0 - 0.2) = 2.3 (timeout)
    #   t4: 1 * (1 + 0.9*0.3 - 0.1) = 1.17
    # corrections v - V, backwards, cut after t1 and t3:
    #   t4: 1.17   t3: 2.3   t2: -6.82 + 0.9*0.8*2.3 = -5.164   t1: 0.8
    #   t0: 0.86 + 0.9*0.8*0.8 = 1.436
    expected_vs = torch.tensor([[1.936], [1.2], [1.836], [2.5], [1.27]])
    # advantages = rho * (r + gamma * v_next * not_terminated - V), where v_next is v[t+1]
    # inside an episode and next_values at an episode end or at the last step:
    #   t0: 1 * (1 + 0.9*1.2 - 0.5) = 1.58     t1: 0.5 * (2 - 0.4) = 0.8
    #   t2: 1 * (0 + 0.9*2.5 - 7) = -4.75      t3: 0.5 * (3 + 0.9*2.0 - 0.2) = 2.3
    #   t4: 1 * (1 + 0.9*0.3 - 0.1) = 1.17
    expected_adv = torch.tensor([[1.58], [0.8], [-4.75], [2.3], [1.17]])
    vs, advantages = vtrace(
        behaviour, target, rewards, values, next_values, terminated, truncated, gamma, 1.0, 0.8
    )
    torch.testing.assert_close(vs, expected_vs)
    torch.testing.assert_close(advantages, expected_adv)


def test_vtrace_on_policy_equals_gae_with_lambda_one() -> None:
    # With pi == mu and no clipping in play, v_s - V(x_s) is the TD(1) advantage.
    generator = torch.Generator().manual_seed(0)
    shape = (6, 3)
    rewards = torch.rand(shape, generator=generator)
    values = torch.rand(shape, generator=generator)
    next_values = torch.cat([values[1:], torch.rand(1, 3, generator=generator)])
    terminated = torch.zeros(shape)
    terminated[2, 1] = 1.0
    truncated = torch.zeros(shape)
    truncated[4, 0] = 1.0
    log_probs = torch.rand(shape, generator=generator).log()
    vs, _ = vtrace(log_probs, log_probs, rewards, values, next_values, terminated, truncated, 0.95)
    advantages, _ = gae(rewards, values, next_values, terminated, truncated, 0.95, 1.0)
    torch.testing.assert_close(vs - values, advantages)
    # With lambda_ the trace is the lambda-return's: v_s - V(x_s) is GAE(lambda).
    vs, _ = vtrace(
        log_probs,
        log_probs,
        rewards,
        values,
        next_values,
        terminated,
        truncated,
        0.95,
        1.0,
        1.0,
        0.8,
    )
    advantages, _ = gae(rewards, values, next_values, terminated, truncated, 0.95, 0.8)
    torch.testing.assert_close(vs - values, advantages)


def test_n_step_return_matches_hand_computation() -> None:
    # Four transitions, each with the 3 steps that start at it; gamma 0.5.
    # row 0: no episode end, all stored           -> 1 + .5*2 + .25*4 = 3, discount .125, 3 steps
    # row 1: terminated at step 1                  -> 1 + .5*2 = 2, discount 0, 2 steps
    # row 2: truncated at step 0 (time limit)      -> 5, discount .5 (bootstrap), 1 step
    # row 3: only steps 0-1 stored (buffer head)   -> 1 + .5*1 = 1.5, discount .25, 2 steps
    rewards = torch.tensor([[1.0, 2.0, 4.0], [1.0, 2.0, 8.0], [5.0, 9.0, 9.0], [1.0, 1.0, 7.0]])
    terminated = torch.tensor([[0, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    truncated = torch.tensor([[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    available = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    returns, discounts, steps = n_step_return(rewards, terminated, truncated, available, 0.5)
    torch.testing.assert_close(returns, torch.tensor([3.0, 2.0, 5.0, 1.5]))
    torch.testing.assert_close(discounts, torch.tensor([0.125, 0.0, 0.5, 0.25]))
    assert steps.tolist() == [3, 2, 1, 2]


def test_one_step_return_is_the_td_target_pieces() -> None:
    returns, discounts, steps = n_step_return(
        torch.tensor([[2.0], [3.0]]),
        torch.tensor([[False], [True]]),
        torch.tensor([[False], [False]]),
        torch.tensor([[True], [True]]),
        0.9,
    )
    torch.testing.assert_close(returns, torch.tensor([2.0, 3.0]))
    torch.testing.assert_close(discounts, torch.tensor([0.9, 0.0]))
    assert steps.tolist() == [1, 1]


def test_polyak_update_soft_and_hard() -> None:
    target = [torch.tensor([0.0, 10.0]), torch.tensor([4.0])]
    online = [torch.tensor([1.0, 20.0]), torch.tensor([8.0])]
    polyak_update(target, online, 0.25)
    # 0.75 * target + 0.25 * online
    torch.testing.assert_close(target[0], torch.tensor([0.25, 12.5]))
    torch.testing.assert_close(target[1], torch.tensor([5.0]))
    polyak_update(target, online, 1.0)
    torch.testing.assert_close(target[0], online[0])
    torch.testing.assert_close(target[1], online[1])


def test_expectile_loss_weights_the_two_signs() -> None:
    from rlfleet.functional import expectile_loss

    diff = torch.tensor([2.0, -2.0, 0.0])
    torch.testing.assert_close(expectile_loss(diff, 0.7), torch.tensor([0.7 * 4, 0.3 * 4, 0.0]))
    # 0.5 is half the squared error: its minimiser is the mean.
    torch.testing.assert_close(expectile_loss(diff, 0.5), 0.5 * diff.pow(2))


def test_conjugate_gradient_solves_a_positive_definite_system() -> None:
    from rlfleet.functional import conjugate_gradient

    generator = torch.Generator().manual_seed(0)
    m = torch.randn(6, 6, generator=generator, dtype=torch.float64)
    a = m @ m.T + 6 * torch.eye(6, dtype=torch.float64)
    b = torch.randn(6, generator=generator, dtype=torch.float64)
    x = conjugate_gradient(lambda v: a @ v, b, max_steps=6)
    torch.testing.assert_close(x, torch.linalg.solve(a, b))


def test_retrace_matches_hand_computation() -> None:
    from rlfleet.functional import retrace

    # One env, gamma 0.5. t=0 mid-episode, t=1 truncated (final obs in row 2 worth 4.0),
    # t=2 a reset step, t=3 terminated; bootstrap value after the rollout 9.0 (unused).
    rewards = torch.tensor([[1.0], [2.0], [0.0], [3.0]])
    q_taken = torch.tensor([[0.5], [1.0], [0.0], [2.0]])
    values = torch.tensor([[0.7], [1.5], [4.0], [2.5], [9.0]])
    rho_bar = torch.tensor([[0.5], [1.0], [1.0], [0.2]])
    terminated = torch.tensor([[0.0], [0.0], [0.0], [1.0]])
    truncated = torch.tensor([[0.0], [1.0], [0.0], [0.0]])
    # Backwards: t=3: 3 (terminal). carry = 0.2*(3-2) + 2.5 = 2.7
    # t=2: 0 + 0.5*2.7 = 1.35.        carry = 1*(1.35-0) + 4.0 = 5.35
    # t=1: 2 + 0.5*4.0 = 4 (timeout). carry = 1*(4-1) + 1.5 = 4.5
    # t=0: 1 + 0.5*4.5 = 3.25
    expected = torch.tensor([[3.25], [4.0], [1.35], [3.0]])
    got = retrace(rewards, q_taken, values, rho_bar, terminated, truncated, 0.5)
    torch.testing.assert_close(got, expected)


def test_standardize_ignores_zero_weight_entries() -> None:
    from rlfleet.functional import standardize

    values = torch.tensor([1.0, 3.0, 100.0])
    out = standardize(values, torch.tensor([1.0, 1.0, 0.0]))
    torch.testing.assert_close(out[:2], torch.tensor([-1.0, 1.0]), atol=1e-6, rtol=0)


def test_twin_q_loss_sums_both_critics_mean_squared_errors() -> None:
    q1 = torch.tensor([[1.0], [2.0]])
    q2 = torch.tensor([[0.0], [0.0]])
    # mean(0^2, 2^2) + mean(1^2, 0^2) = 2 + 0.5
    loss = twin_q_loss((q1, q2), torch.tensor([1.0, 0.0]))
    assert float(loss) == pytest.approx(2.5)


def test_smoothed_target_actions_clip_the_noise_and_the_actions() -> None:
    actions = torch.tensor([[0.0, 0.9, -0.9]])
    noise = torch.randn(actions.shape, generator=torch.Generator().manual_seed(3))
    unchanged = smoothed_target_actions(actions, 0.0, 0.5, noise)
    torch.testing.assert_close(unchanged, actions)
    # A huge std makes every noise draw hit the clip: each action moves by exactly +-0.2
    # (the sign of its draw), then is clipped back into [-1, 1].
    signs = noise.sign()
    smoothed = smoothed_target_actions(actions, 1e6, 0.2, noise)
    torch.testing.assert_close(smoothed, (actions + 0.2 * signs).clamp(-1.0, 1.0))
    assert float(smoothed[0, 0].abs()) == pytest.approx(0.2)
    assert float(smoothed.abs().max()) <= 1.0


def _set_linear(weight: torch.Tensor, bias: torch.Tensor, values: list[list[float]]) -> None:
    with torch.no_grad():
        weight.copy_(torch.tensor(values).reshape(weight.shape))
        bias.zero_()


def test_td3_critic_loss_matches_hand_computation() -> None:
    # One-layer nets on 1-d observations and actions, set by hand:
    # target actor mu'(s') = tanh(0) = 0; target critics Q1' = s + a, Q2' = 2 s + a;
    # online critics Q1 = s + a, Q2 = 0. No smoothing noise.
    cfg = TD3Config(hidden_sizes=(), target_policy_noise=0.0)
    nets = DeterministicActorCritic(
        1, spaces.Box(-1, 1, (1,), np.float32), cfg, twin=True, device=torch.device("cpu")
    )
    _set_linear(nets.actor_target[0].weight, nets.actor_target[0].bias, [[0.0]])
    critic_target, critic = nets.critic_target, nets.critic
    _set_linear(critic_target.weights[0], critic_target.biases[0], [[1, 1], [2, 1]])
    _set_linear(critic.weights[0], critic.biases[0], [[1, 1], [0, 0]])
    obs, actions = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.5], [-0.5]])
    next_obs = torch.tensor([[0.5], [-1.0]])
    batch = BoxBatch(
        obs=obs,
        next_obs=next_obs,
        actions=actions,
        rewards=torch.tensor([1.0, 0.0]),
        discounts=torch.tensor([0.9, 0.0]),
        next_noise=torch.randn(2, 1, generator=torch.Generator().manual_seed(0)),
    )
    loss = td3_critic_loss(nets, batch, cfg)
    # min(Q1', Q2')(s', 0) = min([0.5, -1], [1, -2]) = [0.5, -2];
    # target = [1 + 0.9 * 0.5, 0 + 0 * -2] = [1.45, 0]; Q1 = [1.5, 1.5], Q2 = [0, 0]:
    # mean(0.05^2, 1.5^2) + mean(1.45^2, 0^2) = 1.12625 + 1.05125
    assert float(loss.detach()) == pytest.approx(2.1775)
    loss.backward()
    assert all(p.grad is not None for p in nets.critic.parameters())
    assert all(p.grad is None for p in nets.critic_target.parameters())
