"""torch.profiler windows, shared by the Lightning callback and component profiling (`anemoi_profiler.component`).

`schedule` says which batches a window covers, `stage_profile` drives one `torch.profiler.profile`, `windows`
turns each finished window into a trace (`traces`), a fixed-size summary (`window_summarizer`, `window_summary`),
operator rows (`op_tables`) and CUDA memory readings (`device_memory`), and `operator_reports` writes the time
and memory reports. Nothing here knows about a Trainer, a session or MLflow.
"""
