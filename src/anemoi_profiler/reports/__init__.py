"""What a run folder says, read back from its files: the diagnosis, report.html, plots and comparisons.

Everything here starts from `run_data.RunData`, so the end of a fit, `anemoi-profiler report` a week later
and the tests give the same answers. Nothing here imports torch, nor a plotting library (`plots.figures` does,
for matplotlib figures).
"""
