"""rlfleet's Adam, and the one optimiser step every learner takes.

:func:`adam` builds the optimiser of PPO, DQN, SAC, DDPG, TD3, IMPALA, APPO, CQL, IQL and
TD3+BC. TRPO's critic, BC, MAPPO's central critic, behavioral cloning, the reward signals
and A2C with ``optimizer: adam`` build ``torch.optim.Adam`` directly; ACER and A2C (by
default) build ``torch.optim.RMSprop``.

Every learner in rlfleet (the algorithms, the reward signals, MAPPO's central critic) turns
a loss into a weight update through :func:`optimizer_step`: clear the gradients, backward,
clip the global gradient norm (when a maximum is given), check the loss and the norm, step.
An update that writes its gradients out instead of calling backward (DQN's, see
:mod:`rlfleet.nn.mlp_grad`) sets them and calls the second half, :func:`step_if_finite`.
A non-finite loss or gradient never reaches the optimiser: the learner's ``nan_policy``
decides between raising :class:`~rlfleet.errors.NonFiniteError` and skipping the batch
(:func:`finite_or_skip`). Updates that are not a plain optimiser step (TRPO's line search,
ACER's trust-region gradient) run the same check before they touch the weights.

A step that returns None skipped its batch; an update that takes several optimiser steps
per batch (actor, critics, entropy coefficient) then drops the rest of that gradient step
too: later optimiser steps, target-network updates and its gradient-step counter. Steps
already taken on the batch stay.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol, TypeGuard, cast

import torch
from torch.optim import optimizer as _optimizer_module

from rlfleet.errors import NonFiniteError

NanPolicy = Literal["raise", "skip_batch"]
"""What a non-finite loss or gradient does: ``raise`` NonFiniteError, or ``skip_batch``."""


class NanGuarded(Protocol):
    """A learner that owns a ``nan_policy`` and counts the batches it skipped."""

    nan_policy: NanPolicy
    skipped_batches: int

    def step_label(self) -> str:
        """Who is stepping, and where, for a NonFiniteError (``ppo at gradient step 12``)."""
        ...


def _behind_dynamo_guard(method: Callable[..., Any]) -> Callable[..., Any]:
    """The function that ``torch._disable_dynamo`` wraps in ``method`` (``method`` itself if
    it is not wrapped)."""
    return cast(Callable[..., Any], getattr(method, "__wrapped__", method))


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` that builds, clears and checkpoints without importing
    ``torch._dynamo``.

    ``torch.optim.Optimizer`` guards ``add_param_group`` (which its constructor calls),
    ``zero_grad``, ``state_dict`` and ``load_state_dict`` with ``torch._disable_dynamo``,
    whose first call imports ``torch._dynamo``: about a second of start-up (as much as half
    of ``import torch`` on a 2-core CPU), paid by every process that builds an optimizer,
    also one that never compiles. The guard matters only while dynamo traces the call, and
    rlfleet calls these methods outside any compiled region (``compile: true`` compiles the
    loss and its backward), so this class calls the functions behind the guard. The maths is
    ``torch.optim.Adam``'s: its ``step``, or :func:`fused_adam_step`.
    """

    add_param_group = _behind_dynamo_guard(torch.optim.Optimizer.add_param_group)
    zero_grad = _behind_dynamo_guard(torch.optim.Optimizer.zero_grad)
    state_dict = _behind_dynamo_guard(torch.optim.Optimizer.state_dict)
    load_state_dict = _behind_dynamo_guard(torch.optim.Optimizer.load_state_dict)


def adam(params: Iterable[torch.Tensor], lr: float, eps: float, device: torch.device) -> Adam:
    """Adam with the fused kernel where ``device`` has one (CPU, CUDA): one kernel launch
    updates every parameter, instead of several per tensor."""
    return Adam(params, lr=lr, eps=eps, fused=device.type in ("cpu", "cuda"))


def optimizer_step(
    owner: NanGuarded,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    params: Sequence[torch.Tensor],
    *,
    max_grad_norm: float | None = None,
    inputs: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """One step of ``optimizer`` on ``loss``; returns the global gradient norm (before
    clipping), or None when the batch was skipped.

    ``params`` are the parameters ``optimizer`` updates (a list the caller keeps, so no step
    builds one). Their gradients are cleared (set to None, as ``zero_grad`` does, without its
    per-call bookkeeping), ``loss`` is back-propagated (into ``inputs`` only, when given:
    no gradient is computed for weights this step does not update), then
    :func:`step_if_finite` clips, checks and steps.
    """
    for p in params:
        p.grad = None
    loss.backward(inputs=inputs)
    return step_if_finite(owner, optimizer, loss, params, max_grad_norm=max_grad_norm)


def step_if_finite(
    owner: NanGuarded,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    params: Sequence[torch.Tensor],
    *,
    max_grad_norm: float | None = None,
) -> torch.Tensor | None:
    """Step ``optimizer`` on the gradients already in ``params`` unless ``loss`` or their
    global norm is not finite (see :func:`finite_or_skip`); returns that norm (before
    clipping), or None when the batch was skipped.

    With ``max_grad_norm`` the gradients are first scaled to at most that norm, and the norm
    the clip computes is the one checked; without it the norm is computed for the check
    alone. Either way one host synchronisation per step.
    """
    if max_grad_norm is None:
        norm = _global_norm([p.grad for p in params if p.grad is not None])
    else:
        norm = clip_grad_norm(params, max_grad_norm)
    if not finite_or_skip(owner, loss, norm):
        return None
    if not (is_plain_fused_adam(optimizer) and fused_adam_step(optimizer)):
        optimizer.step()
    return norm


def step_if_finite_captured(
    optimizer: torch.optim.Adam,
    loss: torch.Tensor,
    params: Sequence[torch.Tensor],
    *,
    max_grad_norm: float | None = None,
    skip: torch.Tensor | None = None,
    lr: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`step_if_finite` for a step captured in a CUDA graph (:mod:`rlfleet.nn.cuda_graph`),
    which reads no value on the host: the same clip and the same norm, with the check's
    outcome kept as a tensor. The fused Adam step (:func:`fused_adam_step`, ``lr`` as there)
    skips itself where ``loss`` plus the norm is not finite, or where ``skip`` is true (an
    earlier optimiser step of the same batch was skipped). Returns the norm and the skip flag
    (``skip`` or this check's failure), for the caller to chain into the batch's later steps
    and, after the replay, to apply ``nan_policy`` with :func:`finite_or_skip` on the loss and
    norm that failed."""
    if max_grad_norm is None:
        norm = _global_norm([p.grad for p in params if p.grad is not None])
    else:
        norm = clip_grad_norm(params, max_grad_norm)
    failed = ~torch.isfinite(loss.detach() + norm)
    skip = failed if skip is None else skip | failed
    fused_adam_step(optimizer, lr=lr, skip=skip)
    return norm, skip


def optimizer_step_captured(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    params: Sequence[torch.Tensor],
    checks: list[torch.Tensor],
    *,
    skip: torch.Tensor | None = None,
    inputs: Sequence[torch.Tensor] | None = None,
) -> torch.Tensor:
    """:func:`optimizer_step` inside a captured step: the gradients cleared, ``loss``
    back-propagated (into ``inputs`` only, when given), then :func:`step_if_finite_captured`
    (no clip) with ``skip`` from the batch's earlier steps. Appends the loss and the gradient
    norm to ``checks`` (for :func:`captured_steps_taken` after the replay) and returns the
    skip flag for the batch's later steps. ``optimizer`` is a plain fused Adam
    (:func:`is_plain_fused_adam`)."""
    for p in params:
        p.grad = None
    loss.backward(inputs=inputs)
    fused = cast(torch.optim.Adam, optimizer)
    norm, skip = step_if_finite_captured(fused, loss, params, skip=skip)
    checks += [loss.detach(), norm]
    return skip


def captured_steps_taken(owner: NanGuarded, checks: Sequence[torch.Tensor]) -> int:
    """:func:`finite_or_skip` after the replay of a captured step: ``checks`` holds the loss
    and the gradient norm of each of its optimiser steps, in their order
    (:func:`optimizer_step_captured`). One read of them all on the host, then ``nan_policy``
    on the first step whose check failed (that step and the ones after it skipped
    themselves). Returns how many optimiser steps were taken: all of them when every check
    passed, else those before the first that failed."""
    pairs = list(zip(checks[::2], checks[1::2], strict=True))
    sums = torch.stack([loss + norm for loss, norm in pairs]).tolist()
    for taken, ((loss, norm), total) in enumerate(zip(pairs, sums, strict=True)):
        if not math.isfinite(total):
            finite_or_skip(owner, loss, norm)
            return taken
    return len(pairs)


def is_plain_fused_adam(optimizer: torch.optim.Optimizer) -> TypeGuard[torch.optim.Adam]:
    """Whether ``optimizer`` is an :func:`adam` as rlfleet builds it: ``torch.optim.Adam``
    with the fused kernel, a float learning rate, no amsgrad, maximize, capturable,
    differentiable or decoupled weight decay, and no step hooks (its own or global)."""
    if type(optimizer) not in (torch.optim.Adam, Adam):
        return False
    if (
        optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or _optimizer_module._global_optimizer_pre_hooks
        or _optimizer_module._global_optimizer_post_hooks
    ):
        return False
    return all(
        group["fused"]
        and isinstance(group["lr"], float)
        and not (
            group["amsgrad"]
            or group["maximize"]
            or group["capturable"]
            or group["differentiable"]
            or group["decoupled_weight_decay"]
        )
        for group in optimizer.param_groups
    )


def fused_adam_step(
    optimizer: torch.optim.Adam,
    *,
    lr: torch.Tensor | None = None,
    skip: torch.Tensor | None = None,
) -> bool:
    """``optimizer.step()`` for a plain fused Adam (:func:`is_plain_fused_adam`): the same
    kernels on the same state (lazily created as Adam creates it), so the same numbers and the
    same ``state_dict``, without the Python ``Optimizer.step`` wraps around them (hooks,
    profiling labels, graph-capture checks, grouping by device), which costs more than the
    kernel for small networks stepped thousands of times.

    For a step captured in a CUDA graph (:mod:`rlfleet.nn.cuda_graph`), which must not read a
    value on the host: ``lr``, a one-element float32 tensor on the parameters' device, is the
    learning rate instead of the groups' (so a schedule can change it between replays), and
    ``skip``, a bool tensor there, leaves the parameters, the moments and the step counts
    unchanged where it is true (the kernel's ``found_inf``, as ``torch.optim.Adam`` takes it
    from a gradient scaler).

    Parameters without a gradient are left out, as Adam leaves them out. Returns False, having
    stepped nothing, when the parameters of a group differ in device or dtype (Adam then
    steps them in groups of its own)."""
    batches = []
    for group in optimizer.param_groups:
        params: list[torch.Tensor] = []
        grads: list[torch.Tensor] = []
        exp_avgs: list[torch.Tensor] = []
        exp_avg_sqs: list[torch.Tensor] = []
        steps: list[torch.Tensor] = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if params and (p.dtype != params[0].dtype or p.device != params[0].device):
                return False
            state = optimizer.state[p]
            if not state:
                # As Adam's lazy initialisation of a fused group.
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if params:
            batches.append((group, params, grads, exp_avgs, exp_avg_sqs, steps))
    found_inf = None if skip is None else skip.to(torch.float32)
    with torch.no_grad():
        for group, params, grads, exp_avgs, exp_avg_sqs, steps in batches:
            beta1, beta2 = group["betas"]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                [],
                steps,
                amsgrad=False,
                lr=group["lr"] if lr is None else lr,
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                maximize=False,
                grad_scale=None,
                found_inf=found_inf,
            )
            if found_inf is not None:  # a skipped step does not count, as in torch.optim.Adam
                torch._foreach_sub_(steps, [found_inf] * len(steps))
    return True


def finite_or_skip(owner: NanGuarded, loss: torch.Tensor, grad_norm: torch.Tensor) -> bool:
    """True when ``loss`` and ``grad_norm`` are finite: the update may touch the weights.

    Otherwise, by ``owner.nan_policy``: ``raise`` NonFiniteError, or ``skip_batch``: count
    one skipped batch in ``owner.skipped_batches`` and return False. The caller then leaves
    the weights and the optimiser state as they were.
    """
    # One scalar add and one transfer to the host: torch.isfinite would cost several kernels.
    if math.isfinite(float(loss.detach() + grad_norm)):
        return True
    if owner.nan_policy == "raise":
        raise NonFiniteError(
            f"{owner.step_label()}: non-finite loss ({float(loss.detach()):.4g}) or gradient "
            f"norm ({float(grad_norm):.4g}); the parameters were left unchanged (set "
            "nan_policy: skip_batch to skip such batches, or lower the learning rate)"
        )
    owner.skipped_batches += 1
    return False


def clip_grad_norm(parameters: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale the gradients of ``parameters`` so their global L2 norm is at most ``max_norm``.

    The arithmetic of ``torch.nn.utils.clip_grad_norm_`` for parameters on one device and of
    one dtype, without its per-call grouping and checks, which cost more than the arithmetic
    for small networks updated thousands of times. Returns the norm before clipping.
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = _global_norm(grads)
    torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def _global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all of ``grads`` together: one fused norm per tensor, then one over
    those norms."""
    norm: torch.Tensor = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    return norm
