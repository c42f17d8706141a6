"""One profiled run's lifecycle, shared by the callbacks and component profiling.

`session` joins callbacks into one run; `folder` creates, uploads and announces the run folder;
`clock` measures training and validation per log interval; `distributed` exchanges
a few numbers across ranks; `environment`, `trainer_info` and `metric_history` record what the reports need.
"""
