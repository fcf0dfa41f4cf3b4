"""The optimizers' tensor code, taking plain arguments: what the method modules
above (gpt2/optim/<name>.py) build from a run's settings. Nothing here reads a
Config or says a method's name: a method is declared once, in its module."""
