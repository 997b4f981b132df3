"""The backward pass of a plain MLP written out: the kernels autograd runs, without autograd.

A ``Linear -> activation -> ... -> Linear`` stack (:func:`rlfleet.nn.mlp.mlp` with ReLU or
tanh) trained through ``loss.backward()`` runs, per layer, autograd's nodes (``AddmmBackward``
and ``TBackward`` for the product, the activation's node, one ``AccumulateGrad`` per
parameter) and the engine's bookkeeping between them. For small networks stepped thousands
of times that bookkeeping, not the arithmetic, is much of a gradient step: for DQN's 256x256
Q-network at batch 64 on a CPU, about a fifth of it (``bench/step_profile.py``); PPO's step
with 64x64 tanh actor and critic at batch 256 took 0.84-0.88 ms written out against
0.94-0.97 ms through autograd (one thread, an AMD EPYC).

:class:`PlainMLP` runs the kernels those nodes run, with the same operands and in the same
order: ``addmm`` forward; for each layer, ``grad.t().mm(input)`` for the weight,
``grad.sum(0)`` for the bias and ``grad.mm(weight)`` for the layer below, then
``threshold_backward`` (ReLU) or ``tanh_backward`` (tanh) on the activation's output. The
gradients are therefore bitwise those of ``loss.backward()``, not merely close
(``tests/nn/test_mlp_grad.py`` checks it), and an algorithm can use it without changing its
results. :class:`PlainTwinMLP` does the same for :class:`~rlfleet.nn.twin.TwinMLP`, the
actor and critic of the policy-gradient family as one batched matmul per layer
(``baddbmm``: ``BaddbmmBackward``'s two ``bmm`` and the bias gradient summed over the
batch, as autograd reduces a broadcast bias).

Why not a library: ``torch.autograd.grad`` and ``torch.func.vjp`` run the same engine, and
``torch.compile``, which removes it, lost whole-process on every run measured (docs/user-guide.md,
"Compiled update steps and bf16"; ``bench/results/compile.md``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules import module as _module

from rlfleet.nn.twin import TwinMLP

_Backward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_BACKWARD: dict[type[nn.Module], _Backward] = {
    nn.ReLU: lambda grad, out: torch.ops.aten.threshold_backward(grad, out, 0),
    nn.Tanh: torch.ops.aten.tanh_backward,
}
"""Each supported activation's backward, from the gradient and the activation's output."""

_FORWARD: dict[type[nn.Module], Callable[[torch.Tensor], torch.Tensor]] = {
    nn.ReLU: torch.relu,
    nn.Tanh: torch.tanh,
}

_FUNCTION_BACKWARD: dict[Callable[[torch.Tensor], torch.Tensor], _Backward] = {
    torch.relu: _BACKWARD[nn.ReLU],
    torch.tanh: _BACKWARD[nn.Tanh],
}
"""The backward of each activation function :class:`TwinMLP` takes, as ``_BACKWARD``."""


_MODULE_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_GLOBAL_MODULE_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
)


def has_hooks(network: nn.Module) -> bool:
    """Whether calling ``network`` or back-propagating through it would run a hook: a
    forward or backward hook of it or of a submodule (their own or a global one), or a
    gradient hook of one of its parameters. :class:`PlainMLP` calls no module and runs no
    autograd node, so it would skip them; a network with hooks is trained through autograd."""
    if any(getattr(_module, name) for name in _GLOBAL_MODULE_HOOKS):
        return True
    if any(getattr(m, name) for m in network.modules() for name in _MODULE_HOOKS):
        return True
    return any(
        p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None)
        for p in network.parameters()
    )


class PlainMLP:
    """Forward and backward of a ``Linear -> activation -> ... -> Linear`` stack outside
    autograd, with autograd's kernels (see the module docstring).

    Holds the stack's modules, not copies of their weights: loading a checkpoint into them
    or stepping an optimiser on their parameters is seen by the next call.
    """

    def __init__(self, linears: list[nn.Linear], activation: type[nn.Module]) -> None:
        self.linears = linears
        self._activate = _FORWARD[activation]
        self._activation_backward = _BACKWARD[activation]

    @classmethod
    def of(cls, layers: nn.Sequential) -> PlainMLP | None:
        """The stack ``layers`` as a :class:`PlainMLP`, or None when it is not one: linear
        layers with biases, one activation (ReLU or tanh) between each two, none after the
        last."""
        modules = list(layers)
        linears = modules[::2]
        activations = modules[1::2]
        if not linears or not all(
            type(layer) is nn.Linear and layer.bias is not None for layer in linears
        ):
            return None
        kinds = {type(act) for act in activations}
        if len(activations) != len(linears) - 1 or len(kinds) > 1 or not kinds <= set(_BACKWARD):
            return None
        return cls(linears, kinds.pop() if kinds else nn.ReLU)  # type: ignore[arg-type]

    def parameters(self) -> list[torch.Tensor]:
        """Weight and bias of each layer, first layer first: ``nn.Sequential.parameters``'s
        order, in which :meth:`backward` returns the gradients."""
        return [p for layer in self.linears for p in (layer.weight, layer.bias)]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The output for a ``[batch, features]`` input, and the input of each layer (what
        :meth:`backward` needs). No autograd graph is recorded."""
        inputs: list[torch.Tensor] = []
        with torch.no_grad():
            for i, layer in enumerate(self.linears):
                if i:
                    x = self._activate(x)
                inputs.append(x)
                x = torch.addmm(layer.bias, x, layer.weight.t())
        return x, inputs

    def backward(self, grad: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The gradients of the parameters (in :meth:`parameters`' order) for ``grad``, the
        gradient of the loss with respect to the output of the :meth:`forward` that returned
        ``inputs``. The input's own gradient is not computed."""
        grads: list[torch.Tensor] = []
        with torch.no_grad():
            for i in range(len(self.linears) - 1, -1, -1):
                grads += [grad.sum(0), grad.t().mm(inputs[i])]
                if i:
                    grad = self._activation_backward(grad.mm(self.linears[i].weight), inputs[i])
        grads.reverse()
        return grads


class PlainTwinMLP:
    """Forward and backward of a :class:`~rlfleet.nn.twin.TwinMLP` outside autograd, with
    autograd's kernels (see the module docstring).

    Holds the twin itself, not copies of its weights, as :class:`PlainMLP` does.
    """

    def __init__(self, twin: TwinMLP, activation_backward: _Backward) -> None:
        self.twin = twin
        self._activation_backward = activation_backward

    @classmethod
    def of(cls, twin: TwinMLP) -> PlainTwinMLP | None:
        """``twin`` as a :class:`PlainTwinMLP`, or None when its activation is neither ReLU
        nor tanh."""
        backward = _FUNCTION_BACKWARD.get(twin.activation)
        return None if backward is None else cls(twin, backward)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Both MLPs' outputs as one ``[2, batch, max(out_features)]`` tensor (the padding
        columns of the narrower one included) for a ``[batch, in]`` input, and each layer's
        input (what :meth:`backward` needs). No autograd graph is recorded."""
        inputs: list[torch.Tensor] = []
        layers = self.twin._layers
        last = len(layers) - 1
        with torch.no_grad():
            h = x.unsqueeze(0).expand(2, *x.shape)
            for layer, (weight, bias) in enumerate(layers):
                inputs.append(h)
                h = torch.baddbmm(bias, h, weight)
                if layer < last:
                    h = self.twin.activation(h)
        return h, inputs

    def backward(
        self, grad: torch.Tensor, inputs: list[torch.Tensor]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The ``(weight, bias)`` gradients of each layer, first layer first, for ``grad``,
        the gradient of the loss with respect to the output of the :meth:`forward` that
        returned ``inputs``. The input's own gradient is not computed."""
        layers = self.twin._layers
        grads: list[tuple[torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for layer in range(len(layers) - 1, -1, -1):
                grads.append((inputs[layer].transpose(1, 2).bmm(grad), grad.sum(1, keepdim=True)))
                if layer:
                    below = grad.bmm(layers[layer][0].transpose(1, 2))
                    grad = self._activation_backward(below, inputs[layer])
        grads.reverse()
        return grads
