"""The test matrix: plan (which cells), runner (one process per cell), results
(what the cells left behind), plots and report (what a researcher reads)."""
