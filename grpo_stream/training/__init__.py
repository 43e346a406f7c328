"""The trainer's library: batches to tensors, the update step, checkpoints, metrics."""
