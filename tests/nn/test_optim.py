"""The shared optimiser step: backward, clip, the non-finite check by ``nan_policy``, step."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from rlfleet.errors import NonFiniteError
from rlfleet.nn.optim import (
    adam,
    clip_grad_norm,
    finite_or_skip,
    fused_adam_step,
    is_plain_fused_adam,
    optimizer_step,
    step_if_finite,
)
from tests.nan_injection import Owner


def _model() -> tuple[torch.nn.Linear, torch.optim.Adam, list[torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    params = list(model.parameters())
    return model, torch.optim.Adam(params, lr=0.1), params


def test_clip_grad_norm_matches_torch() -> None:
    torch.manual_seed(0)
    ours = [torch.randn(3, 4, requires_grad=True), torch.randn(5, requires_grad=True)]
    theirs = [p.detach().clone().requires_grad_() for p in ours]
    for group in (ours, theirs):
        for p in group:
            p.grad = torch.full_like(p, 3.0)
    norm = clip_grad_norm(ours, 0.5)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    torch.testing.assert_close(norm, expected)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    # Small gradients are left alone.
    small = [torch.zeros(2, requires_grad=True)]
    small[0].grad = torch.tensor([0.1, 0.1])
    clip_grad_norm(small, 1.0)
    torch.testing.assert_close(small[0].grad, torch.tensor([0.1, 0.1]))


def test_clip_grad_norm_scales_to_the_limit_and_leaves_small_gradients() -> None:
    a = torch.zeros(2, requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    a.grad = torch.tensor([3.0, 0.0])
    b.grad = torch.tensor([4.0])
    norm = clip_grad_norm([a, b], 1.0)  # global norm 5 -> scaled by 1/5
    assert float(norm) == pytest.approx(5.0)
    torch.testing.assert_close(a.grad, torch.tensor([0.6, 0.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(b.grad, torch.tensor([0.8]), atol=1e-5, rtol=0)
    clip_grad_norm([a, b], 10.0)  # norm 1 <= 10: unchanged
    torch.testing.assert_close(b.grad, torch.tensor([0.8]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("max_grad_norm", [None, 0.1])
def test_a_finite_step_is_the_plain_backward_clip_and_step(max_grad_norm: float | None) -> None:
    x = torch.randn(8, 3)
    model, optimizer, params = _model()
    by_hand, by_hand_optimizer, by_hand_params = _model()
    for p in params + by_hand_params:  # stale gradients are cleared, not accumulated
        p.grad = torch.ones_like(p)

    norm = optimizer_step(
        Owner(), optimizer, model(x).pow(2).mean(), params, max_grad_norm=max_grad_norm
    )
    by_hand_optimizer.zero_grad()
    by_hand(x).pow(2).mean().backward()
    expected = torch.nn.utils.clip_grad_norm_(by_hand_params, max_grad_norm or float("inf"))
    by_hand_optimizer.step()

    assert norm is not None
    assert torch.equal(norm, expected)
    for ours, theirs in zip(params, by_hand_params, strict=True):
        assert torch.equal(ours, theirs)


def test_inputs_limit_the_backward_to_the_stepped_parameters() -> None:
    model, optimizer, params = _model()
    other = torch.nn.Linear(1, 1)
    loss = other(model(torch.randn(4, 3))).mean()
    assert optimizer_step(Owner(), optimizer, loss, params, inputs=params) is not None
    assert all(p.grad is None for p in other.parameters())
    assert all(p.grad is not None for p in params)


@pytest.mark.parametrize("where", ["loss", "gradient"])
def test_raise_leaves_parameters_and_optimiser_state_alone(where: str) -> None:
    model, optimizer, params = _model()
    optimizer_step(Owner(), optimizer, model(torch.randn(4, 3)).mean(), params)
    before = [p.detach().clone() for p in params]
    state_before = [t.clone() for s in optimizer.state.values() for t in s.values()]
    loss = model(torch.randn(4, 3)).mean()
    if where == "loss":  # a NaN loss whose gradient is still finite
        loss = loss + torch.tensor(float("nan"))
    else:
        params[0].register_hook(lambda grad: torch.full_like(grad, float("inf")))
    with pytest.raises(
        NonFiniteError,
        match=r"^owner at gradient step 7: non-finite loss \(.+\) or gradient norm \(.+\); "
        r"the parameters were left unchanged \(set nan_policy: skip_batch",
    ):
        optimizer_step(Owner(), optimizer, loss, params, max_grad_norm=1.0)
    assert all(torch.equal(a, b) for a, b in zip(params, before, strict=True))
    state_after = [t for s in optimizer.state.values() for t in s.values()]
    assert all(torch.equal(a, b) for a, b in zip(state_after, state_before, strict=True))


def test_skip_batch_counts_and_returns_none() -> None:
    model, optimizer, params = _model()
    owner = Owner("skip_batch")
    before = [p.detach().clone() for p in params]
    params[1].register_hook(lambda grad: grad * float("nan"))
    for _ in range(3):
        assert optimizer_step(owner, optimizer, model(torch.randn(4, 3)).mean(), params) is None
    assert owner.skipped_batches == 3
    assert all(torch.equal(a, b) for a, b in zip(params, before, strict=True))
    assert not optimizer.state  # Adam never stepped


def test_step_if_finite_checks_gradients_computed_elsewhere() -> None:
    model, optimizer, params = _model()
    loss = model(torch.randn(4, 3)).mean()
    torch.autograd.backward([loss], [torch.tensor(float("nan"))])
    owner = Owner("skip_batch")
    assert step_if_finite(owner, optimizer, loss, params) is None
    assert owner.skipped_batches == 1


def test_finite_or_skip_passes_finite_values() -> None:
    owner = Owner()
    assert finite_or_skip(owner, torch.tensor(1e30), torch.tensor(3e38))
    assert not finite_or_skip(Owner("skip_batch"), torch.tensor(1.0), torch.tensor(float("-inf")))
    assert owner.skipped_batches == 0


def _twin_adams(**options: Any) -> tuple[list[torch.nn.Module], list[torch.optim.Adam]]:
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))]
    nets.append(copy.deepcopy(nets[0]))
    optimizers = [torch.optim.Adam(net.parameters(), lr=1e-2, **options) for net in nets]
    return nets, optimizers


def test_the_fused_adam_step_is_adams_step_bit_for_bit() -> None:
    nets, (reference, fast) = _twin_adams(fused=True, eps=1e-5, weight_decay=0.01)
    assert is_plain_fused_adam(fast)
    generator = torch.Generator().manual_seed(1)
    for i in range(50):
        x = torch.randn(32, 4, generator=generator)
        for net, optimizer in zip(nets, (reference, fast), strict=True):
            optimizer.param_groups[0]["lr"] = 1e-2 * (1 - i / 50)
            for p in net.parameters():
                p.grad = None
            net(x).pow(2).mean().backward()
            if i == 7:  # a parameter without a gradient is left out, as Adam leaves it out
                net[0].bias.grad = None
        reference.step()
        assert fused_adam_step(fast)
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert torch.equal(a, b)
    ours, theirs = fast.state_dict(), reference.state_dict()
    assert ours["state"].keys() == theirs["state"].keys()
    for key, state in theirs["state"].items():
        for name, value in state.items():
            assert torch.equal(ours["state"][key][name], value)
            assert ours["state"][key][name].dtype == value.dtype


@pytest.mark.parametrize(
    "options",
    [{"fused": False}, {"fused": True, "amsgrad": True}, {"fused": True, "maximize": True}],
)
def test_other_adams_take_their_own_step(options: dict[str, Any]) -> None:
    _, (optimizer, _) = _twin_adams(**options)
    assert not is_plain_fused_adam(optimizer)


def test_an_adam_with_a_step_hook_takes_its_own_step() -> None:
    _, (optimizer, _) = _twin_adams(fused=True)
    handle = optimizer.register_step_post_hook(lambda *args: None)
    assert not is_plain_fused_adam(optimizer)
    handle.remove()
    assert is_plain_fused_adam(optimizer)
    assert not is_plain_fused_adam(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1))


def test_parameters_of_mixed_dtypes_are_left_to_adam() -> None:
    params = [
        torch.zeros(2, requires_grad=True),
        torch.zeros(2, dtype=torch.float64, requires_grad=True),
    ]
    optimizer = torch.optim.Adam(params, lr=0.1, fused=True)
    for p in params:
        p.grad = torch.ones_like(p)
    assert not fused_adam_step(optimizer)
    assert all(not p.any() for p in params)


def test_rlfleets_adam_is_torchs_adam_step_for_step_and_in_its_checkpoint() -> None:
    nets = [torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))]
    nets.append(copy.deepcopy(nets[0]))
    reference = torch.optim.Adam(nets[0].parameters(), lr=1e-2, fused=True)
    ours = adam(nets[1].parameters(), 1e-2, 1e-8, torch.device("cpu"))
    assert is_plain_fused_adam(ours)
    assert isinstance(ours, torch.optim.Adam)
    generator = torch.Generator().manual_seed(2)
    for _ in range(20):
        x = torch.randn(32, 4, generator=generator)
        for net, optimizer in zip(nets, (reference, ours), strict=True):
            optimizer.zero_grad()
            net(x).pow(2).mean().backward()
            optimizer.step()
    for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        assert torch.equal(a, b)
    saved, theirs = ours.state_dict(), reference.state_dict()
    assert saved["param_groups"] == theirs["param_groups"]
    restored = adam(nets[1].parameters(), 1e-3, 1e-8, torch.device("cpu"))
    restored.load_state_dict(theirs)  # a checkpoint of either loads into the other
    assert restored.param_groups[0]["lr"] == 1e-2
    for key, state in theirs["state"].items():
        for name, value in state.items():
            assert torch.equal(saved["state"][key][name], value)
            assert torch.equal(restored.state_dict()["state"][key][name], value)


def test_training_and_checkpointing_do_not_import_torch_dynamo(tmp_path: Path) -> None:
    # torch.optim.Optimizer's guarded methods import torch._dynamo on first use: about a
    # second of every process's start-up, which rlfleet's optimiser does not pay.
    script = f"""
import sys
from rlfleet.cli.main import main
code = main(["train", "ppo", "--env", "CartPole-v1", "--max-steps", "600",
             "--run-dir", {str(tmp_path / "run")!r}])
assert code in (None, 0), code
assert "torch._dynamo" not in sys.modules, "torch._dynamo was imported"
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run").is_dir()
