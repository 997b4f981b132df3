"""The installed rlfleet version (written into checkpoints and run metadata)."""

__version__ = "0.1.0"
