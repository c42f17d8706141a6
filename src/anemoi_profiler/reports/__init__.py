"""What a run folder says, read back from its files: the diagnosis, report.html, plots and comparisons.

Everything here starts from `run_data.RunData`, so the end of a fit, `anemoi-profiler report` a week later
and the tests give the same answers. Nothing here imports torch or MLflow (a run that lives only in MLflow is
downloaded by `tracking.run_download` first); matplotlib is imported when the first plot is drawn (`charts`).
"""
