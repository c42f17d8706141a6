"""The `anemoi-profiler` command line: `main` builds the parser from one module per command.

Each command module registers its own arguments and imports what it runs (torch, Lightning, MLflow, HTA)
only when it runs: `anemoi-profiler --help`, `sync`, `analyze`, `report` and `compare` start
without importing torch.
"""
