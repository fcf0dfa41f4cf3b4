"""Configuration: the typed Config (options.py) and the strict .config loader (kconfig.py)."""
