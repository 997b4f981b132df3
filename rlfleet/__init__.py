"""rlfleet: deep reinforcement learning with PyTorch behind one trainer vocabulary."""

__version__ = "0.1.0"
