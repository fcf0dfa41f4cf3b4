"""The training loop and what it owns: the step, evaluation, the schedule,
checkpoints and resume, the run's records (provenance, trackers, the summary), and
one-shot pruning's fine-tune. The algorithms it runs are in gpt2/optim/algorithms
and gpt2/sparsity/algorithms, the device and processes in gpt2/runtime, the
estimates of what a run costs in gpt2/estimates."""
