"""accel_train: one Accelerate training loop for every setup, from a laptop CPU to multi-node DDP."""

__version__ = "0.1.0"
