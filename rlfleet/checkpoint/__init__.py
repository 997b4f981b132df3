"""Atomic, checksummed checkpoints that never unpickle anything.

Three modules, one job each:

- :mod:`rlfleet.checkpoint.codec`: a training state <-> its tensors plus a strict-JSON
  skeleton that refers to them by key;
- :mod:`rlfleet.checkpoint.durable`: one checkpoint directory (``tensors.safetensors``,
  ``state.json``, ``meta.json``, ``manifest.json``), written atomically and fsynced, read only
  after every file verifies against the manifest's sha256 and size;
- :mod:`rlfleet.checkpoint.manager`: :class:`CheckpointManager`, a folder of step-numbered
  checkpoints with rotation and an atomic ``latest.json`` pointer;
- :mod:`rlfleet.checkpoint.schema`: pydantic models of the files and of the states rlfleet's
  loaders read, so that a crafted or damaged file gets a one-line error naming the key.

Why this format is written by hand. ``torch.save`` pickles, and unpickling a file runs
whatever code its author put in it, so a checkpoint from elsewhere would be a program.
``torch.load(weights_only=True)`` unpickles only tensors and plain containers, so numpy
arrays and numpy scalars (replay rows, normalizer statistics) need an allow-list of globals,
and the file is still a pickle that every reader must remember to open with that flag.
safetensors, which parses without executing anything, stores a flat map of tensors only,
not the nested state a resumable run saves (optimizer state with int keys, RNG states with
128-bit integers, ``-inf`` best scores, tuples). So the tensors go to safetensors and the
rest to a small strict-JSON skeleton (:mod:`~rlfleet.checkpoint.codec`); the manifest and
the rename into place (:mod:`~rlfleet.checkpoint.durable`) make a crash leave either no
checkpoint or a complete one.
"""

from rlfleet.checkpoint.codec import flatten_state, unflatten_state
from rlfleet.checkpoint.durable import (
    FORMAT_VERSION,
    NewerFormatError,
    load_checkpoint,
    read_metadata,
    save_checkpoint,
)
from rlfleet.checkpoint.manager import CheckpointManager

__all__ = [
    "FORMAT_VERSION",
    "CheckpointManager",
    "NewerFormatError",
    "flatten_state",
    "load_checkpoint",
    "read_metadata",
    "save_checkpoint",
    "unflatten_state",
]
