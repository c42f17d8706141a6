"""Write docs/configuration.md from the config dataclasses (run by the docs build and checked by a test)."""

from __future__ import annotations

import sys
from pathlib import Path

from anemoi_profiler.config import PRESETS, reference

HEADER = """# Configuration reference

Generated from `anemoi_profiler.config` by `python docs/gen_config_reference.py`; do not edit by hand.

Load a config with `ProfilerConfig.load(source, overrides)`: `source` is a YAML file, a preset
({presets}), a mapping, or a section of a Hydra/OmegaConf tree such as `cfg.diagnostics.profiler`
([Hydra, OmegaConf and LightningCLI](hydra.md)); `overrides` are `key=value` strings. From the command line:
`anemoi-profiler config [--config FILE | --preset NAME] [key=value ...]` validates and prints the result.
A wrong key, type or value fails at load time with a message naming the key and what is allowed.

| key | type | default | meaning |
| --- | --- | --- | --- |
"""


def render() -> str:
    lines = [HEADER.format(presets=", ".join(f"`{p}`" for p in PRESETS))]
    for key, kind, default, help_text in reference():
        shown = "null" if default is None else str(default).lower() if isinstance(default, bool) else default
        lines.append(f"| `{key}` | {kind} | `{shown}` | {help_text.replace('<', '&lt;')} |\n")
    return "".join(lines)


if __name__ == "__main__":
    target = Path(__file__).with_name("configuration.md")
    target.write_text(render())
    sys.stdout.write(f"wrote {target}\n")
