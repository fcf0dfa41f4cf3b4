"""Where training runs: the device and its precision, the process group of a
multi-GPU run, and the launcher that starts one (torchrun). Below the algorithms
and the training loop; above the model, data and run folder only in that the
launcher names a run folder."""
