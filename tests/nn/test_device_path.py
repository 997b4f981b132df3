"""The accelerator path, covered on the CPU: what an update or an action draw builds lands
on the network's device. The ``meta`` device stands in for an accelerator here (its tensors
have a device, a shape and a dtype but no data), so a tensor left behind on the CPU shows as
one whose device is not ``meta``. The end-to-end runs on a real GPU are ``bench/gpu.py``'s,
and the last test here, which runs only where CUDA is available."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

from rlfleet import functional as F
from rlfleet.data.minibatches import rollout_minibatches
from rlfleet.data.replay import ReplayBuffer
from rlfleet.nn import distributions as D
from rlfleet.nn.deterministic import box_batch
from rlfleet.nn.masks import masked_uniform
from rlfleet.types import ReplayBatch
from tests.data.test_minibatches import _rollout

META = torch.device("meta")


def _draws(device: torch.device, generator: torch.Generator) -> list[torch.Tensor]:
    """Every kind of random draw an action or an update takes, for outputs on ``device``."""
    logits = torch.zeros(4, 3, device=device)
    mean, log_std = torch.zeros(4, 2, device=device), torch.zeros(2, device=device)
    sample = ReplayBatch(
        obs=logits,
        actions=mean,
        rewards=torch.zeros(4, device=device),
        next_obs=logits,
        discounts=torch.ones(4, device=device),
        weights=torch.ones(4, device=device),
        indices=np.arange(4),
    )
    # The noise of SAC's policy samples and of TD3's target-policy smoothing in an update.
    batch = box_batch(
        sample,
        lambda obs: obs,
        lambda actions: actions,
        generator=generator,
        noise=True,
        next_noise=True,
    )
    assert batch.noise is not None
    assert batch.next_noise is not None
    return [
        *D.categorical_sample(logits, generator),
        D.gaussian_sample(mean, log_std, generator),
        *D.squashed_gaussian_sample(mean, log_std, generator),
        *D.bernoulli_sample(logits, generator),
        masked_uniform(torch.ones(4, 3, dtype=torch.bool, device=device), generator),
        batch.noise,
        F.smoothed_target_actions(mean, 0.2, 0.5, batch.next_noise),
    ]


def test_draws_land_on_the_device_of_the_network_outputs() -> None:
    for tensor in _draws(META, torch.Generator().manual_seed(0)):
        assert tensor.device == META


def test_a_seed_draws_the_same_stream_on_every_device() -> None:
    """The algorithm's generator is a CPU one wherever its networks are: on an accelerator
    it takes the same draws from it as on the CPU, so a checkpoint's generator state means
    the same on both."""
    on_cpu, on_meta = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    _draws(torch.device("cpu"), on_cpu)
    _draws(META, on_meta)
    assert torch.equal(on_cpu.get_state(), on_meta.get_state())


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if dataclasses.is_dataclass(value):
        return [t for f in dataclasses.fields(value) for t in _tensors(getattr(value, f.name))]
    return []


def test_a_replay_batch_moves_to_the_device_whole() -> None:
    space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (4, 4, 3), np.uint8),
            "pos": spaces.Box(-1, 1, (2,), np.float32),
        }
    )
    buffer = ReplayBuffer(8, space, spaces.Box(-1, 1, (2,), np.float32))
    for t in range(3):
        buffer.add(
            {"image": np.full((1, 4, 4, 3), t, np.uint8), "pos": np.zeros((1, 2), np.float32)},
            np.zeros((1, 2), np.float32),
            np.ones(1),
            np.zeros(1, bool),
            np.zeros(1, bool),
            np.ones(1, bool),
        )
    batch = buffer.sample(16, gamma=0.9)
    assert batch.to(torch.device("cpu")) is batch  # nothing is copied on the CPU
    moved = batch.to(META)
    tensors = _tensors(moved)
    assert len(tensors) == len(_tensors(batch)) == 8  # 2 + 2 observation keys, 4 others
    assert all(t.device == META for t in tensors)
    assert moved.obs["image"].dtype == torch.uint8  # images travel as bytes
    assert moved.indices is batch.indices  # the priority update reads them on the host


@pytest.mark.parametrize("state_shape", [None, (2,)], ids=["steps", "sequences"])
def test_rollout_minibatches_are_on_the_networks_device(state_shape: tuple[int, ...]) -> None:
    storage = _rollout(state_shape)
    advantages = torch.zeros(storage.num_steps, storage.num_envs)
    minibatches = rollout_minibatches(
        storage,
        advantages,
        advantages.clone(),
        6,
        torch.Generator().manual_seed(0),
        2 if state_shape else None,
        device=META,
    )
    seen = 0
    for minibatch in minibatches.epoch():
        tensors = _tensors(minibatch)
        assert tensors
        assert all(t.device == META for t in tensors)
        seen += 1
    assert seen > 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("algo", "env_id", "hyperparameters"),
    [
        ("ppo", "CartPole-v1", {}),
        ("ppo", "CartPole-v1", {"lstm_hidden_size": 16}),
        ("dqn", "CartPole-v1", {}),
        ("sac", "Pendulum-v1", {}),
    ],
    ids=["ppo", "ppo-lstm", "dqn", "sac"],
)
def test_a_run_trained_on_cuda_loads_on_the_cpu(
    algo: str, env_id: str, hyperparameters: dict[str, Any], tmp_path: Path
) -> None:
    from rlfleet.runs.config import default_run_config
    from rlfleet.runs.run import load_algorithm, train

    cfg = default_run_config(
        algo,
        env_id,
        {
            "device": "cuda",
            "hyperparameters": hyperparameters,
            "trainer": {
                "max_steps": 2_000,
                "epoch_num_steps": 1_000,
                "test_step_num_episodes": 2,
                "show_progress": False,
                "verbose": False,
            },
        },
    )
    train(cfg, tmp_path / "run")
    on_gpu, _ = load_algorithm(tmp_path / "run", device="cuda")
    on_cpu, _ = load_algorithm(tmp_path / "run", device="cpu")
    obs = np.stack([on_cpu.observation_space.sample() for _ in range(64)])
    np.testing.assert_allclose(on_gpu.predict(obs), on_cpu.predict(obs), atol=1e-5)
    if isinstance(on_cpu.action_space, spaces.Discrete) and on_cpu.supports_masks:
        # A mask given as an array reaches the GPU policy too: only action 1 is legal.
        mask = np.zeros((64, int(on_cpu.action_space.n)), bool)
        mask[:, 1] = True
        assert (on_gpu.predict(obs, action_mask=mask) == 1).all()
