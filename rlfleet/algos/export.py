"""Export an algorithm's deterministic policy as an ONNX graph, for deployment without rlfleet
(the way ML-Agents' ``save_model`` writes its ``.onnx`` policy).

The graph runs what :meth:`Algorithm.predict` runs after an observation has been laid out:

1. the observation normalisation, with the algorithm's frozen running statistics (for an
   algorithm with an ``obs_normalizer``);
2. the policy's greedy action: the mode of the policy distribution (PPO, A2C, TRPO, ACER,
   IMPALA, APPO, BC with discrete actions), the argmax of the Q-values (DQN, discrete CQL),
   the deterministic actor (SAC, DDPG, TD3, IQL, CQL, TD3+BC, BC with Box actions), never
   honouring a masked-out action when an ``action_mask`` input is exported;
3. the conversion to what the env takes: Box actions scaled to and clipped at the Box's
   bounds, discrete indices shifted by the space's ``start``, in the space's shape and dtype.

Inputs and outputs (each with a dynamic batch dim):

``obs``
    ``[batch, *obs_layout.shape]``: the observation as :class:`rlfleet.nn.obs.ObsLayout`
    lays it out, so ``algo.obs_layout.to_tensor(obs).numpy()`` makes it. A Box observation
    is itself (float32), an image stays uint8. A Dict, Discrete, MultiDiscrete or
    MultiBinary observation is one packed float32 row: the Dict's parts in the order of its
    keys (gymnasium sorts a plain dict's keys; nested Dicts depth first, the ``action_mask``
    key left out), a Discrete part as a one-hot of
    ``n`` entries, a MultiDiscrete part as concatenated one-hots, Box and MultiBinary parts
    flattened. The ``rlfleet.observation_layout`` metadata entry lists each part's key path,
    encoding, offset and size, so a deployment can build the row without rlfleet.
``action_mask`` (only with ``action_mask=True``)
    ``[batch, mask_size]`` bool, as :mod:`rlfleet.nn.masks` defines it; an action whose entry
    is false is never chosen. Only for algorithms that honour masks (``supports_masks``).
``actions``
    ``[batch, *action_space.shape]`` in the action space's dtype, ready for ``env.step``.

Metadata (``metadata_props`` of the model, strings; JSON where structured):
``rlfleet.algorithm``, ``rlfleet.version``, ``rlfleet.inputs`` (name, shape, dtype of each
input), ``rlfleet.outputs``, ``rlfleet.observation_space`` and ``rlfleet.action_space`` (as
checkpoints write them), ``rlfleet.observation_layout``, ``rlfleet.obs_normalization``.

Recurrent policies (PPO with ``lstm_hidden_size``) are refused with a ConfigError: their
state would have to travel between calls, which this graph does not carry.

The exporter: ``torch.onnx.export(..., dynamo=False)``, the TorchScript tracer. The
torch.export-based exporter (``dynamo=True``, the default since torch 2.9) needs the extra
``onnxscript`` package and ``torch.export`` of each ``act``; the tracer needs only ``onnx``,
and a policy's greedy path is straight-line tensor code (its branches depend on the config and
the spaces, never on values), which tracing records exactly. The parity test
(``tests/algos/test_export.py``) holds every algorithm's graph to its torch ``predict``.
Its DeprecationWarning is silenced here, where the choice is made.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlfleet.envs.spaces import describe_space, space_to_json
from rlfleet.errors import ConfigError, replacing
from rlfleet.nn.masks import MASK_KEY
from rlfleet.nn.normalize import RunningNormalizer
from rlfleet.nn.obs import Leaf, ObsLayout
from rlfleet.types import PolicyStep
from rlfleet.version import __version__

OPSET = 17
"""ONNX opset of the exported graph (onnxruntime >= 1.14 runs it)."""
INPUT_NAME = "obs"
MASK_INPUT_NAME = "action_mask"
OUTPUT_NAME = "actions"


class ExportablePolicy(Protocol):
    """What the export reads of an algorithm (every :class:`rlfleet.algos.base.Algorithm`)."""

    name: ClassVar[str]
    supports_masks: ClassVar[bool]
    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    obs_layout: ObsLayout
    obs_normalizer: RunningNormalizer | None
    mask_segments: tuple[int, ...] | None
    device: torch.device

    def act(
        self,
        obs: torch.Tensor,
        *,
        deterministic: bool = False,
        action_mask: torch.Tensor | None = None,
        state: torch.Tensor | None = None,
    ) -> PolicyStep: ...

    def modules(self) -> dict[str, nn.Module]: ...

    def initial_state(self, num_envs: int) -> torch.Tensor | None: ...


def export_onnx(
    algo: ExportablePolicy, path: str | Path, *, action_mask: bool | None = None
) -> Path:
    """Write ``algo``'s deterministic policy to the ONNX file ``path`` (see the module doc).

    ``action_mask``: add the ``action_mask`` input (None: when the observation carries one,
    as a Dict key ``action_mask``). Returns the path written.

    Raises:
        ConfigError: the policy is recurrent, a mask input is asked of an algorithm that
            does not honour masks or of an action space that cannot be masked, or the
            ``onnx`` extra is not installed.
    """
    try:
        import onnx  # optional dependency (the `onnx` extra), needed only to export
    except ImportError:
        raise ConfigError(
            "exporting to ONNX needs the onnx package: pip install 'rlfleet[onnx]'"
        ) from None
    if algo.initial_state(1) is not None:
        raise ConfigError(
            f"{algo.name} has a recurrent policy (lstm_hidden_size), whose state must travel "
            "between calls; ONNX export covers feed-forward policies only"
        )
    with_mask = algo.obs_layout.mask_in_obs if action_mask is None else action_mask
    if with_mask and not algo.supports_masks:
        raise ConfigError(
            f"{algo.name} does not honour action masks; export it without action_mask"
        )
    if with_mask and algo.mask_segments is None:
        raise ConfigError(
            f"action space {describe_space(algo.action_space)} cannot be masked; export "
            "without action_mask"
        )
    path = Path(path)
    policy = GreedyPolicy(algo)
    example = _example_inputs(algo, with_mask)
    names = [INPUT_NAME, MASK_INPUT_NAME][: len(example)]
    # Traced into a temporary file and the metadata added before it takes ``path``'s place:
    # an export that fails never leaves a half-written model there.
    with replacing(path) as traced:
        with warnings.catch_warnings():
            # The TorchScript exporter is deprecated in favour of the dynamo one (see module doc).
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(
                policy,
                example,
                str(traced),
                dynamo=False,
                opset_version=OPSET,
                input_names=names,
                output_names=[OUTPUT_NAME],
                dynamic_axes={name: {0: "batch"} for name in [*names, OUTPUT_NAME]},
                # Traced in eval mode; the exporter restores each module's mode afterwards.
                training=torch.onnx.TrainingMode.EVAL,
            )
        model = onnx.load(str(traced))
        model.doc_string = (
            f"rlfleet {algo.name} deterministic policy: obs -> actions (see rlfleet.algos.export)"
        )
        for key, value in export_metadata(algo, with_mask).items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(model, str(traced))
    return path


class GreedyPolicy(nn.Module):
    """``obs`` (and ``action_mask``) to env actions: the module the export traces."""

    def __init__(self, algo: ExportablePolicy) -> None:
        super().__init__()
        self.algo = algo
        # Registered so that the networks' weights become the graph's initializers.
        self.nets = nn.ModuleDict(algo.modules())
        space = algo.action_space
        self.low: torch.Tensor | None = None
        self.high: torch.Tensor | None = None
        if isinstance(space, spaces.Box):
            self.low = torch.as_tensor(space.low, dtype=torch.float32, device=algo.device)
            self.high = torch.as_tensor(space.high, dtype=torch.float32, device=algo.device)
        self.start: torch.Tensor | None = None
        if isinstance(space, spaces.Discrete | spaces.MultiDiscrete) and np.any(space.start):
            start = np.asarray(space.start)
            self.start = torch.as_tensor(start, dtype=torch.int64, device=algo.device)
        self.out_dtype = _torch_dtype(space.dtype)

    def forward(self, obs: torch.Tensor, action_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.algo.obs_normalizer is not None:
            obs = self.algo.obs_normalizer(obs)
        step = self.algo.act(obs, deterministic=True, action_mask=action_mask)
        actions = step.actions
        space = self.algo.action_space
        shape = tuple(space.shape or ())
        actions = actions.reshape(actions.shape[0], *shape)
        if self.low is not None and self.high is not None:
            actions = torch.maximum(torch.minimum(actions, self.high), self.low)
        if self.start is not None:
            actions = actions + self.start
        return actions.to(self.out_dtype)


def export_metadata(algo: ExportablePolicy, with_mask: bool) -> dict[str, str]:
    """The ``metadata_props`` an exported model carries (see the module doc)."""
    layout = algo.obs_layout
    inputs: list[dict[str, Any]] = [
        {
            "name": INPUT_NAME,
            "shape": ["batch", *layout.shape],
            "dtype": str(layout.dtype).removeprefix("torch."),
        }
    ]
    if with_mask:
        assert algo.mask_segments is not None
        inputs.append(
            {"name": MASK_INPUT_NAME, "shape": ["batch", sum(algo.mask_segments)], "dtype": "bool"}
        )
    action_space = algo.action_space
    outputs = [
        {
            "name": OUTPUT_NAME,
            "shape": ["batch", *(action_space.shape or ())],
            "dtype": str(np.dtype(action_space.dtype)),
        }
    ]
    return {
        "rlfleet.algorithm": algo.name,
        "rlfleet.version": __version__,
        "rlfleet.inputs": json.dumps(inputs),
        "rlfleet.outputs": json.dumps(outputs),
        "rlfleet.observation_space": json.dumps(space_to_json(algo.observation_space)),
        "rlfleet.action_space": json.dumps(space_to_json(action_space)),
        "rlfleet.observation_layout": json.dumps(observation_layout(layout)),
        # IMPALA and APPO normalise inside ``act`` (their statistics are the learner's), so
        # the module, not the ``obs_normalizer`` attribute, says whether the graph does.
        "rlfleet.obs_normalization": "in_graph" if "obs_normalizer" in algo.modules() else "none",
    }


def observation_layout(layout: ObsLayout) -> dict[str, Any]:
    """How an observation becomes the ``obs`` input, as JSON (the module doc explains it).

    ``kind`` is ``vector`` (the Box observation as it is), ``image`` (uint8 as it is) or
    ``packed``; a packed row lists its ``parts``, each with the Dict key ``path``, its
    ``encoding`` (``values``: flattened, ``one_hot``: a Discrete part, ``one_hots``: a
    MultiDiscrete part, ``image_bytes``: an image's uint8 bytes after the float features),
    ``offset`` and ``size`` (float features, or bytes for images).
    """
    described: dict[str, Any] = {
        "kind": layout.kind,
        "shape": list(layout.shape),
        "dtype": str(layout.dtype).removeprefix("torch."),
        "mask_key": MASK_KEY if layout.mask_in_obs else None,
    }
    if layout.kind == "packed":
        described["float_features"] = layout.num_floats
        described["parts"] = [_describe_leaf(leaf) for leaf in layout.leaves]
    return described


def _describe_leaf(leaf: Leaf) -> dict[str, Any]:
    part: dict[str, Any] = {"path": list(leaf.path), "offset": leaf.offset, "size": leaf.size}
    space = leaf.space
    if leaf.image:
        part["encoding"] = "image_bytes"
        part["shape"] = list(space.shape or ())
    elif isinstance(space, spaces.Discrete):
        part["encoding"] = "one_hot"
        part["start"] = int(space.start)
    elif isinstance(space, spaces.MultiDiscrete):
        part["encoding"] = "one_hots"
        part["nvec"] = [int(n) for n in space.nvec.reshape(-1)]
        part["start"] = [int(s) for s in np.asarray(space.start).reshape(-1)]
    else:
        part["encoding"] = "values"
        part["shape"] = list(space.shape or ())
    return part


def _example_inputs(algo: ExportablePolicy, with_mask: bool) -> tuple[torch.Tensor, ...]:
    """A batch of two zero observations (and all-true masks) to trace with."""
    layout = algo.obs_layout
    obs = torch.zeros((2, *layout.shape), dtype=layout.dtype, device=algo.device)
    if not with_mask:
        return (obs,)
    assert algo.mask_segments is not None
    mask = torch.ones((2, sum(algo.mask_segments)), dtype=torch.bool, device=algo.device)
    return obs, mask


def _torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (what ``env.step`` takes)."""
    return torch.from_numpy(np.zeros((), dtype=np.dtype(dtype))).dtype
