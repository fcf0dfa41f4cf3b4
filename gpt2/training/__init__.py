"""Training: device and precision, optimizers, pruning, schedule, checkpoints, results."""
