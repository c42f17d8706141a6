"""The run folder's names and file formats, written during the run and read back by the reports.

`layout` names every file and folder; `steps_file` is `steps.json` (each step's duration), `metrics_file` is
`metrics.json`, `system_tables` the nodes' and GPUs' samples under `system_metrics/`, `postmortem_files` the records
under `postmortem/`, `stack_frames` how a stack reads as a phase, `faulthandler_dump` a wedged process's dump.
Nothing here imports torch, Lightning or MLflow.
"""
