"""The pruning methods' tensor code, taking plain arguments: masks, schedules,
scores, the 2:4 kernel. The method modules above (gpt2/sparsity/<name>.py) build
it from a run's settings; nothing here says a method's name."""
