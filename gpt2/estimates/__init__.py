"""What a configuration will cost before it runs: peak memory (memory.py, the
`make memcheck` prediction and auto-batch) and FLOPs per token (flops.py, for MFU).
They build the model and the optimizer's state as training would, so they sit above
the algorithms and below the training loop."""
