"""Datasets: registry, offline tokenizer, preparation and memory-mapped loading."""
