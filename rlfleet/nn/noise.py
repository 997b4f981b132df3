"""Temporally correlated exploration noise: Gaussian noise whose power spectrum falls as
``1/f**beta``.

``beta`` 0 is white noise, a fresh independent draw each step (what every algorithm uses
by default); 1 is pink noise; 2 is red (Brownian-like) noise. The larger ``beta``, the
longer the noise keeps one sign, so an agent acting with it moves further in one direction
before it turns back: what a task needs whose reward lies beyond where independent
per-step noise takes the agent (MountainCarContinuous). Each step's noise is still a unit
Gaussian, so a policy's log-probability of the action it took is unchanged.

As exploration noise of off-policy algorithms: Eberhard et al. 2023, "Pink Noise Is All You
Need: Colored Noise Exploration in Deep Reinforcement Learning" (ICLR); in PPO: Hollenstein
et al. 2024, "Colored Noise in PPO: Improved Exploration and Performance through Correlated
Action Sampling" (AAAI, arXiv:2312.11091). Sequences are drawn by the spectral method of
Timmer and König 1995 ("On generating power law noise", A&A 300, 707), normalised to unit
variance.

Written here rather than taken from ``colorednoise`` (which ``pink-noise-rl`` wraps): those
draw from numpy's random state, while rlfleet's acting draws from seeded torch generators
whose state a checkpoint keeps. Here chunk ``k`` of the sequences comes from a generator
seeded by ``(seed, k)``, so the whole state of the noise process is one step counter: a
checkpoint saves it, and a resumed run continues the same noise.
"""

from __future__ import annotations

import math

import numpy as np
import torch

NOISE_CHUNK = 1024
"""Steps of noise drawn at once per env and action dimension: the longest period the noise
varies over (at 1,000 steps, about the longest episode of the classic tasks)."""


def powerlaw_noise(
    beta: float, shape: tuple[int, ...], length: int, generator: torch.Generator
) -> torch.Tensor:
    """Float64 ``[*shape, length]`` sequences of unit-variance Gaussian noise with power
    spectrum ``1/f**beta`` along the last axis."""
    freqs = torch.fft.rfftfreq(length, dtype=torch.float64)
    freqs[0] = 1.0 / length  # the lowest frequency a sequence of this length resolves
    scale = freqs ** (-beta / 2.0)
    weights = scale[1:].clone()
    weights[-1] *= (1 + length % 2) / 2.0
    sigma = 2.0 * math.sqrt(float((weights**2).sum())) / length
    real = torch.randn((*shape, freqs.numel()), generator=generator, dtype=torch.float64)
    imag = torch.randn((*shape, freqs.numel()), generator=generator, dtype=torch.float64)
    real = real * scale
    imag = imag * scale
    if length % 2 == 0:  # the Nyquist component of a real signal is real
        imag[..., -1] = 0.0
        real[..., -1] *= math.sqrt(2.0)
    imag[..., 0] = 0.0  # so is the mean
    real[..., 0] *= math.sqrt(2.0)
    noise: torch.Tensor = torch.fft.irfft(torch.complex(real, imag), n=length, dim=-1)
    return noise / sigma


def indexed_generator(seed: int, index: int) -> torch.Generator:
    """A torch generator for draw ``index`` of a noise process seeded with ``seed``: the same
    pair always gives the same numbers, whatever was drawn before, so that a process's whole
    state is the count of its steps."""
    state = np.random.SeedSequence([seed, index]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) >> 1)


class ColoredNoise:
    """Per-env streams of ``1/f**beta`` noise for ``action_dim`` action dimensions; each
    :meth:`sample` is the next step of every env's stream. Its whole state is :attr:`step`,
    which the algorithm's checkpoint keeps."""

    def __init__(self, beta: float, action_dim: int, seed: int, length: int = NOISE_CHUNK):
        self.beta = beta
        self.action_dim = action_dim
        self.seed = seed
        self.length = length
        self.step = 0
        """Steps sampled so far."""
        self._chunk: torch.Tensor | None = None
        self._chunk_key: tuple[int, int] = (-1, -1)

    def sample(self, num_envs: int, device: torch.device) -> torch.Tensor:
        """Float32 ``[num_envs, action_dim]`` noise of the current step, on ``device``;
        advances the step."""
        index, offset = divmod(self.step, self.length)
        if self._chunk is None or self._chunk_key != (index, num_envs):
            generator = indexed_generator(self.seed, index)
            chunk = powerlaw_noise(self.beta, (num_envs, self.action_dim), self.length, generator)
            # Steps first, so that each step's noise is one contiguous block.
            self._chunk = chunk.permute(2, 0, 1).contiguous().to(torch.float32).to(device)
            self._chunk_key = (index, num_envs)
        self.step += 1
        return self._chunk[offset]


def next_noise(
    noise: ColoredNoise | None, deterministic: bool, num_envs: int, device: torch.device
) -> torch.Tensor | None:
    """The next step of ``noise`` for ``num_envs`` envs; None when acting greedily (no step
    is used) or without a noise process (the algorithm draws independent noise itself)."""
    return None if noise is None or deterministic else noise.sample(num_envs, device)
