"""The GPT-2 model and its size presets."""
