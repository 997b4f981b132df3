"""Independent random streams from one run seed."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.algos.dqn import DQN, DQNConfig
from rlfleet.seeding import stream_seed


def test_stream_seeds_are_fixed_and_distinct() -> None:
    seeds = {stream_seed(s, stream) for s in range(50) for stream in ("algorithm", "replay")}
    assert len(seeds) == 100
    assert all(0 <= s < 2**63 for s in seeds)
    assert stream_seed(7, "replay") == stream_seed(7, "replay")


def test_algorithm_draws_do_not_repeat_its_initial_weights() -> None:
    # The global torch RNG initialises the network with the run seed; the algorithm's own
    # generator must not replay those numbers as its exploration draws.
    obs = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    algo = DQN(obs, spaces.Discrete(2), DQNConfig(hidden_sizes=(256, 256)), seed=8)
    draws = torch.rand(1024, generator=algo.generator)
    init_draws = torch.rand(1024, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(draws, init_draws)
    weights = algo.q_net.q[0].weight.detach().flatten()
    agreement = ((draws < 0.5) == (weights > 0)).float().mean().item()
    assert 0.4 < agreement < 0.6


def test_replay_sampler_does_not_share_the_env_reset_stream() -> None:
    obs = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    algo = DQN(obs, spaces.Discrete(2), DQNConfig(), seed=8)
    sampler = algo.replay_sampler()
    env_stream = np.random.default_rng(8).bit_generator.state["state"]
    assert sampler.rng.bit_generator.state["state"] != env_stream  # type: ignore[attr-defined]
