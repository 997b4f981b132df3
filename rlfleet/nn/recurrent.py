"""An LSTM core whose state is reset at episode starts, for recurrent policies.

The state of a batch of envs is one tensor ``[batch, 2, hidden]`` (``h`` and ``c``
stacked), so collectors keep and store it like any other per-env array. A step's state
is reset (zeroed) when that step begins a new episode; collectors do this before calling
the policy and store the state they used, and :meth:`LSTMCore.sequence` replays the same
resets when the update re-runs a stored sequence.
"""

from __future__ import annotations

import torch
from torch import nn


class LSTMCore(nn.Module):
    """One ``LSTMCell`` over encoder features, with orthogonal weights and zero biases
    (as in CleanRL's recurrent PPO)."""

    def __init__(self, in_features: int, hidden_size: int) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(in_features, hidden_size)
        for name, param in self.cell.named_parameters():
            if "bias" in name:
                nn.init.zeros_(param)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.hidden_size = hidden_size

    def initial_state(self, batch: int, device: torch.device | None = None) -> torch.Tensor:
        """Zero state for ``batch`` envs."""
        return torch.zeros(batch, 2, self.hidden_size, device=device)

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step for a batch: ``([batch, in], [batch, 2, hidden]) -> (output, new state)``."""
        h, c = self.cell(x, (state[:, 0], state[:, 1]))
        return h, torch.stack((h, c), dim=1)

    def sequence(self, x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """Outputs ``[L, batch, hidden]`` for inputs ``[L, batch, in]`` from ``state``,
        zeroing the state before every step where ``starts`` ``[L, batch]`` is 1."""
        h, c = state[:, 0], state[:, 1]
        keep = (1.0 - starts).unsqueeze(-1)
        outputs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h * keep[t], c * keep[t]))
            outputs.append(h)
        return torch.stack(outputs)
