"""Looking at results: what is in a results folder, and the ways to read it.

- ``catalog``     every run and matrix under a folder, read from their files only
- ``compare``     ``make compare``: the settings that differ and the figures, as a
                  table, a CSV and overlaid loss curves
- ``pages``       ``make results``: static HTML pages (results/index.html, a page per
                  run and per matrix) that open from disk
- ``tensorboard`` ``make tensorboard``: TensorBoard event files for runs made without
                  the tracker, from their metrics.jsonl

Nothing here trains or changes a run: it reads run folders and writes beside them.
"""
