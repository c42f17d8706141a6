"""The `anemoi-profiler` command line: `main` builds the parser from one module per command.

Each command module registers its own arguments and imports what it runs (torch, Lightning, MLflow, HTA)
only when it runs: `anemoi-profiler --help` and every command that trains nothing (all but `demo` and
`component`) start without importing torch.
"""
