"""One profiled run's lifecycle, shared by the callbacks and component profiling.

`session` joins callbacks into one run and ends it; `folder` creates, uploads and announces the run folder;
`run_page` writes the MLflow run's tags, params and description; `environment` records versions and hardware;
`window_triggers` opens windows from the clock's exchange and lists them; `spooled_sink` opens a rank's MLflow sink.
"""
