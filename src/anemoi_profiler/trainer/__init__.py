"""What the profiler reads from and adds to a Lightning Trainer, for both `lightning.pytorch` and `pytorch_lightning`.

`callback_base` is the `Callback` base both namespaces accept; `trainer_info` reads a trainer by duck typing;
`lightning_private` holds every private Lightning name the profiler depends on, each checked per version.
"""
