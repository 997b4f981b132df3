"""A gradient step captured once as a CUDA graph and replayed from then on: one launch a
step instead of one a kernel.

A small network's gradient step on a GPU is several dozen kernels (forward, backward,
gradient clip, the non-finite check, the optimiser step), each shorter than its launch, so
the host's launching is the step's time. Replaying a capture launches them all at once.

Written here because PyTorch's own graph tools each take part of the step:
``torch.cuda.make_graphed_callables`` graphs a module's forward and backward, not the clip,
the check and the optimiser step, which are as many launches again; ``torch.compile`` with
``mode="reduce-overhead"`` graphs what it compiles and pays for the compilation in every
process (``bench/compile.py``). This module drives ``torch.cuda.CUDAGraph`` as PyTorch
documents whole-network capture: warm-up calls on a side stream, then one capture.

What a captured step may do: read its inputs from tensors that keep their storage (the
caller copies each batch into them, :func:`fill_static`), and the parameters and optimiser
state, which change in place; launch kernels only, with no value read on the host and no
branch on one (the optimiser step skips a non-finite step itself and can read a changing
learning rate from a tensor, :func:`rlfleet.nn.optim.fused_adam_step`). Its outputs are the
same tensors on every call, overwritten by the next one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

import torch

from rlfleet.errors import ConfigError
from rlfleet.nn.optim import is_plain_fused_adam

T = TypeVar("T")


class GraphedStep(Generic[T]):
    """``step`` run eagerly for its first ``warmup`` calls (on a side stream, as capture
    needs: lazily built state such as the optimiser's moments and the libraries' workspaces
    exists before the capture), captured on the next call and replayed on every call after.

    Every call takes one step: the warm-up calls are real steps, and the capturing call
    replays its capture at once. A call returns ``step``'s outputs; after the capture they are
    the same tensors each time, so copy what must outlive the next call.
    """

    def __init__(self, step: Callable[[], T], device: torch.device, *, warmup: int = 3) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self._step = step
        self._device = device
        self._warmup_left = warmup
        self._stream = torch.cuda.Stream(device)
        self._graph: torch.cuda.CUDAGraph | None = None
        self._outputs: T | None = None

    @property
    def captured(self) -> bool:
        """Whether the step is captured (later calls replay it)."""
        return self._graph is not None

    def __call__(self) -> T:
        if self._graph is not None:
            self._graph.replay()
            return self._outputs  # type: ignore[return-value]
        current = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(current)
        if self._warmup_left > 0:
            self._warmup_left -= 1
            with torch.cuda.stream(self._stream):
                outputs = self._step()
            current.wait_stream(self._stream)
            return outputs
        graph = torch.cuda.CUDAGraph()
        # thread_local: a collector thread acting on the same device may launch meanwhile.
        with torch.cuda.graph(graph, stream=self._stream, capture_error_mode="thread_local"):
            outputs = self._step()
        graph.replay()
        self._graph, self._outputs = graph, outputs
        return outputs


class CapturedSteps:
    """An algorithm's captured gradient steps: one :class:`GraphedStep` for each kind of step
    (TD3's with and without its actor step), all reading one batch, which each call refills
    in place (:func:`fill_static`)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self.batch: Any = None
        """The tensors the captures read (None until the first call)."""
        self._steps: dict[Hashable, GraphedStep[tuple[torch.Tensor, ...]]] = {}

    @property
    def captured(self) -> bool:
        """Whether a step is captured (its later calls replay it)."""
        return any(step.captured for step in self._steps.values())

    def __call__(
        self,
        kind: Hashable,
        batch: Any,
        step: Callable[[Any], tuple[torch.Tensor, ...]],
    ) -> tuple[torch.Tensor, ...] | None:
        """``step`` of ``kind`` on ``batch``: warmed up, then captured and replayed (one
        capture per kind; ``step`` reads the kept batch it is given). None, having run
        nothing, when ``batch`` does not fit the tensors of the first one (other shapes or
        dtypes): the caller steps it eagerly."""
        if self.batch is None:
            self.batch = to_static(batch, self._device)
        elif not fill_static(self.batch, batch):
            return None
        graphed = self._steps.get(kind)
        if graphed is None:
            static = self.batch
            graphed = GraphedStep(lambda: step(static), self._device)
            self._steps[kind] = graphed
        return graphed()


def refuse_uncapturable(
    name: str, device: torch.device, optimizers: Mapping[str, torch.optim.Optimizer]
) -> None:
    """The ConfigError of ``trainer.cuda_graphs`` for algorithm ``name`` on ``device`` with
    ``optimizers`` (by attribute name), unless the device is CUDA and each optimiser is
    rlfleet's fused Adam, whose step a capture can hold
    (:func:`~rlfleet.nn.optim.fused_adam_step`)."""
    if device.type != "cuda":
        raise ConfigError(f"{name}: trainer.cuda_graphs needs a CUDA device, got device {device}")
    for attribute, optimizer in optimizers.items():
        if not is_plain_fused_adam(optimizer):
            raise ConfigError(
                f"{name}: trainer.cuda_graphs needs rlfleet's fused Adam optimiser (no step "
                f"hooks) as {attribute}, got {type(optimizer).__name__}"
            )


def fill_static(static: Any, value: Any) -> bool:
    """Copy the tensors of ``value`` into those of ``static`` in place; False, having copied
    nothing, when the two differ in structure, shape or dtype (a capture that reads
    ``static`` cannot take ``value``). Both are alike nested tensors, dicts, dataclasses and
    None; any other value (a NumPy array, a number) is not copied."""
    if not _same_layout(static, value):
        return False
    _copy(static, value)
    return True


def to_static(value: Any, device: torch.device) -> Any:
    """``value`` with each of its tensors copied to ``device`` into storage of its own, for
    :func:`fill_static` to refill (nested as :func:`fill_static` takes them; other values
    are kept as they are)."""
    if isinstance(value, torch.Tensor):
        return torch.empty_like(value, device=device).copy_(value)
    if isinstance(value, dict):
        return {k: to_static(v, device) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: to_static(getattr(value, f.name), device) for f in _fields(value)}
        return dataclasses.replace(value, **changes)
    return value


def _fields(value: Any) -> tuple[dataclasses.Field[Any], ...]:
    return tuple(f for f in dataclasses.fields(value) if f.init)


def _same_layout(static: Any, value: Any) -> bool:
    if isinstance(static, torch.Tensor):
        return (
            isinstance(value, torch.Tensor)
            and static.shape == value.shape
            and static.dtype == value.dtype
        )
    if isinstance(static, dict):
        return (
            isinstance(value, dict)
            and static.keys() == value.keys()
            and all(_same_layout(static[k], value[k]) for k in static)
        )
    if dataclasses.is_dataclass(static):
        return type(static) is type(value) and all(
            _same_layout(getattr(static, f.name), getattr(value, f.name)) for f in _fields(static)
        )
    if static is None or value is None:
        return static is None and value is None
    return not isinstance(value, torch.Tensor | dict)


def _copy(static: Any, value: Any) -> None:
    if isinstance(static, torch.Tensor):
        static.copy_(value, non_blocking=True)
    elif isinstance(static, dict):
        for k in static:
            _copy(static[k], value[k])
    elif dataclasses.is_dataclass(static):
        for f in _fields(static):
            _copy(getattr(static, f.name), getattr(value, f.name))
