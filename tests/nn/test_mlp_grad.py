"""PlainMLP: gradients bitwise equal to autograd's, for the stacks it accepts; others refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rlfleet.nn.mlp import Activation, mlp
from rlfleet.nn.mlp_grad import PlainMLP, has_hooks


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("hidden", [(), (8,), (64, 64), (256, 256)])
def test_gradients_are_bitwise_autograds(activation: Activation, hidden: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    layers = mlp(5, hidden, 3, activation)
    plain = PlainMLP.of(layers)
    assert plain is not None
    x = torch.randn(37, 5)
    grad_out = torch.randn(37, 3)

    out = layers(x)
    out.backward(grad_out)
    theirs = [p.grad for p in layers.parameters()]

    mine_out, inputs = plain.forward(x)
    mine = plain.backward(grad_out, inputs)
    assert not mine_out.requires_grad
    assert torch.equal(mine_out, out.detach())
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert b is not None
        assert a.shape == b.shape
        assert torch.equal(a, b)


def test_sees_weights_changed_after_it_was_built() -> None:
    layers = mlp(4, (8,), 2, "relu")
    plain = PlainMLP.of(layers)
    assert plain is not None
    with torch.no_grad():
        for p in layers.parameters():
            p.add_(1.0)
    x = torch.randn(3, 4)
    assert torch.equal(plain.forward(x)[0], layers(x).detach())
    assert plain.parameters() == list(layers.parameters())


@pytest.mark.parametrize(
    "layers",
    [
        mlp(4, (8,), 2, "elu"),
        mlp(4, (8,), 2, "relu", activate_output=True),
        nn.Sequential(nn.Linear(4, 8, bias=False), nn.ReLU(), nn.Linear(8, 2)),
        nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Tanh(), nn.Linear(8, 2)),
        nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2)),
        nn.Sequential(),
    ],
)
def test_refuses_stacks_it_cannot_differentiate(layers: nn.Sequential) -> None:
    assert PlainMLP.of(layers) is None


def test_hooks_of_any_kind_are_seen() -> None:
    # A network with hooks must go through autograd, which runs them; PlainMLP would not.
    def fresh() -> nn.Sequential:
        return mlp(4, (8,), 2, "relu")

    assert not has_hooks(fresh())
    net = fresh()
    net[2].register_forward_hook(lambda *_: None)
    assert has_hooks(net)
    net = fresh()
    net.register_full_backward_hook(lambda *_: None)
    assert has_hooks(net)
    net = fresh()
    net[0].weight.register_hook(lambda grad: grad)
    assert has_hooks(net)
    net = fresh()
    net[0].bias.register_post_accumulate_grad_hook(lambda _: None)
    assert has_hooks(net)
    handle = nn.modules.module.register_module_forward_pre_hook(lambda *_: None)
    try:
        assert has_hooks(fresh())
    finally:
        handle.remove()
    assert not has_hooks(fresh())


@pytest.mark.parametrize("activation", ["relu", "tanh"])
@pytest.mark.parametrize("hidden", [(), (8,), (64, 64)])
def test_twin_gradients_are_bitwise_autograds(
    activation: Activation, hidden: tuple[int, ...]
) -> None:
    from rlfleet.nn.mlp_grad import PlainTwinMLP
    from rlfleet.nn.twin import TwinMLP

    torch.manual_seed(0)
    twin = TwinMLP(5, hidden, (3, 1), activation)
    plain = PlainTwinMLP.of(twin)
    assert plain is not None
    x = torch.randn(37, 5)
    grad_first, grad_second = torch.randn(37, 3), torch.randn(37, 1)

    first, second = twin(x)
    torch.autograd.backward([first, second], [grad_first, grad_second])
    theirs = {id(p): p.grad for p in twin.parameters()}

    out, inputs = plain.forward(x)
    assert not out.requires_grad
    assert torch.equal(out[0, :, :3], first.detach())
    assert torch.equal(out[1, :, :1], second.detach())
    grad_out = torch.zeros_like(out)
    grad_out[0, :, :3] = grad_first
    grad_out[1, :, :1] = grad_second
    mine = plain.backward(grad_out, inputs)
    assert len(mine) == len(twin._layers)
    for (weight, bias), (grad_weight, grad_bias) in zip(twin._layers, mine, strict=True):
        assert torch.equal(grad_weight, theirs[id(weight)])
        assert torch.equal(grad_bias, theirs[id(bias)])


def test_twin_with_an_activation_it_cannot_differentiate_is_refused() -> None:
    from rlfleet.nn.mlp_grad import PlainTwinMLP
    from rlfleet.nn.twin import TwinMLP

    assert PlainTwinMLP.of(TwinMLP(4, (8,), (2, 1), "elu")) is None
