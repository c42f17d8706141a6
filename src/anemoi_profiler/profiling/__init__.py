"""torch.profiler windows shared by the Lightning callback and component profiling.

`schedule` says which batches a window covers, `recorder` drives one `torch.profiler.profile`, `windows`
turns each finished window into a trace (`traces`), operator rows (`op_tables`) and CUDA memory readings
(`device_memory`), `reports` writes the time and memory reports, and `component` profiles a single module
outside a Trainer with the same machinery.
"""
