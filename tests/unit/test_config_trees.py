"""The profiler's config inside a user's OmegaConf or Hydra tree: sections as Hydra hands them over, the schema
merged into the tree, the ConfigStore group, and callbacks built by Hydra's `instantiate`.

tests/system/test_hydra.py runs this module again against omegaconf 2.3 with hydra-core 1.3 (the dev venv has
omegaconf 2.4, which hydra-core 1.3 does not accept); the Hydra tests run there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from anemoi_profiler.config import ConfigError, ProfilerConfig, register_hydra_configs

Compose = Callable[[Sequence[str]], Any]


def user_tree(profiler: dict[str, Any]) -> Any:
    """An anemoi-like tree: the profiler under diagnostics.profiler, interpolating paths from elsewhere."""
    return OmegaConf.create(
        {
            "paths": {"output": "/data/experiment-7", "logs": "${paths.output}/logs"},
            "training": {"max_steps": 1000},
            "diagnostics": {"log": {"mlflow": {"enabled": True}}, "profiler": profiler},
        }
    )


def test_a_dictconfig_section_loads_like_a_mapping_with_nested_sections_and_interpolations() -> None:
    tree = user_tree(
        {
            "output_dir": "${paths.logs}/profiler",
            "log_every_n_steps": "${oc.select:training.log_every,25}",
            "throughput": {"warmup_steps": 3},
            "profiler": {"enabled": True, "train": {"active": 2, "repeat": 4}},
            "distributed": {"profiled_ranks": [0, 1]},
        }
    )
    config = ProfilerConfig.load(tree.diagnostics.profiler, overrides=["system.interval_s=2"])

    assert config.output_dir == "/data/experiment-7/logs/profiler"
    assert config.log_every_n_steps == 25
    assert config.throughput.warmup_steps == 3
    assert (config.profiler.enabled, config.profiler.train.active, config.profiler.train.repeat) == (True, 2, 4)
    assert config.profiler.train.skip_first == 10  # defaults fill what the section leaves out
    assert config.distributed.profiled_ranks == [0, 1]
    assert config.system.interval_s == 2.0
    assert tree.diagnostics.profiler.output_dir == "/data/experiment-7/logs/profiler"  # the tree is not changed
    assert OmegaConf.is_interpolation(tree.diagnostics.profiler, "output_dir")


def test_a_whole_dictconfig_and_a_plain_dict_give_the_same_config() -> None:
    section = {"log_every_n_steps": 7, "tracking": {"experiment": "weather"}}
    from_tree = ProfilerConfig.load(OmegaConf.create(section))
    assert from_tree == ProfilerConfig.load(section)
    assert from_tree.fingerprint() == ProfilerConfig.load(section).fingerprint()


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"throughput": {"warmupsteps": 3}}, r"^diagnostics\.profiler\.throughput\.warmupsteps: unknown key; allowed"),
        ({"throughput": {"warmup_steps": -1}}, r"^diagnostics\.profiler\.throughput\.warmup_steps: got -1, expected"),
        ({"log_every_n_steps": "ten"}, r"^diagnostics\.profiler\.log_every_n_steps: .*expected int"),
        ({"throughput": 5}, r"^throughput: got 5, expected a section of keys: enabled, warmup_steps"),
        ({"output_dir": "${paths.nope}"}, r"^diagnostics\.profiler\.output_dir: Interpolation key 'paths\.nope'"),
    ],
)
def test_errors_name_the_key_as_it_is_in_the_users_tree(section: dict[str, Any], message: str) -> None:
    tree = user_tree(section)
    with pytest.raises(ConfigError, match=message):
        ProfilerConfig.load(tree.diagnostics.profiler)


def test_a_list_node_is_refused_with_a_message() -> None:
    with pytest.raises(ConfigError, match="expected a mapping of keys, got ListConfig"):
        ProfilerConfig.load(OmegaConf.create([1, 2]))


def test_the_schema_merged_into_the_users_tree_makes_typos_fail_there() -> None:
    tree = user_tree({"output_dir": "${paths.output}/profiler"})
    tree.diagnostics.profiler = OmegaConf.merge(OmegaConf.structured(ProfilerConfig), tree.diagnostics.profiler)

    tree.diagnostics.profiler.log_every_n_steps = 10  # a known key takes a value of its type
    with pytest.raises(ConfigKeyError, match="log_every_n_stepz"):
        tree.diagnostics.profiler["log_every_n_stepz"] = 10
    with pytest.raises(ValidationError, match="warmup_steps"):
        tree.diagnostics.profiler.throughput.warmup_steps = "many"
    with pytest.raises(ConfigKeyError, match="warmupsteps"):
        OmegaConf.merge(tree, OmegaConf.from_dotlist(["diagnostics.profiler.throughput.warmupsteps=3"]))

    config = ProfilerConfig.load(tree.diagnostics.profiler)
    assert (config.output_dir, config.log_every_n_steps) == ("/data/experiment-7/profiler", 10)


def test_ensure_validates_a_built_config_and_loads_anything_else(tmp_path: Path) -> None:
    built = ProfilerConfig()
    assert ProfilerConfig.ensure(built) is built
    built.log_every_n_steps = 0  # as a jsonargparse-built dataclass could be: types checked, ranges not
    with pytest.raises(ConfigError, match=r"log_every_n_steps: got 0, expected an integer >= 1"):
        ProfilerConfig.ensure(built)
    assert ProfilerConfig.ensure("detailed").profiler.enabled
    assert ProfilerConfig.ensure(None) == ProfilerConfig()
    path = tmp_path / "profiler.yaml"
    path.write_text("log_every_n_steps: 3\n")
    assert ProfilerConfig.ensure(path).log_every_n_steps == 3
    assert ProfilerConfig.ensure(user_tree({"log_every_n_steps": 4}).diagnostics.profiler).log_every_n_steps == 4


# ---- Hydra (run against hydra-core 1.3 by tests/system/test_hydra.py) ----


@pytest.fixture
def hydra_compose(tmp_path: Path) -> Iterator[Compose]:
    """Compose `config.yaml` below a temporary config dir with the profiler's group registered."""
    pytest.importorskip("hydra", reason="hydra-core needs omegaconf < 2.4: system/test_hydra.py runs this with it")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_hydra_configs()
    (tmp_path / "config.yaml").write_text(
        "defaults:\n  - profiler: simple\n  - _self_\n"
        "paths:\n  output: /data/experiment-7\n"
        "diagnostics:\n  profiler:\n    output_dir: ${paths.output}/profiler\n"
        "  callbacks:\n"  # as anemoi lists the callbacks it instantiates
        "    - _target_: anemoi_profiler.ThroughputCallback\n      config: ${diagnostics.profiler}\n"
        "    - _target_: anemoi_profiler.SystemMetricsCallback\n      config: ${diagnostics.profiler}\n"
    )
    with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
        yield lambda overrides: compose("config", overrides=list(overrides))
    GlobalHydra.instance().clear()


def test_hydra_group_selects_a_preset_and_command_line_overrides_apply(hydra_compose: Compose) -> None:
    simple = ProfilerConfig.load(hydra_compose([]).diagnostics.profiler)
    assert not simple.profiler.enabled
    assert simple.output_dir == "/data/experiment-7/profiler"

    tree = hydra_compose(["profiler=detailed", "diagnostics.profiler.log_every_n_steps=10"])
    detailed = ProfilerConfig.load(tree.diagnostics.profiler)
    assert detailed.profiler.enabled and detailed.model_summary.enabled and detailed.hta.enabled
    assert detailed.log_every_n_steps == 10
    assert detailed.output_dir == "/data/experiment-7/profiler"  # the application's own values still win
    assert detailed == ProfilerConfig.load("detailed", [f"output_dir={detailed.output_dir}", "log_every_n_steps=10"])


def test_hydra_refuses_a_typo_and_a_wrong_type_when_it_composes(hydra_compose: Compose) -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as typo:
        hydra_compose(["diagnostics.profiler.log_every_n_stepz=10"])
    assert "Key 'log_every_n_stepz' not in 'ProfilerConfig'" in str(typo.value.__cause__)
    with pytest.raises(ConfigCompositionException) as wrong:
        hydra_compose(["diagnostics.profiler.throughput.warmup_steps=many"])
    assert "diagnostics.profiler.throughput.warmup_steps" in str(wrong.value.__cause__)


def test_hydra_instantiate_builds_callbacks_from_the_users_tree(hydra_compose: Compose) -> None:
    """anemoi instantiates its callbacks from a list in the tree; `config: ${diagnostics.profiler}` names ours."""
    from hydra.utils import instantiate

    tree = hydra_compose(["diagnostics.profiler.throughput.warmup_steps=2"])
    throughput, system = (instantiate(spec) for spec in tree.diagnostics.callbacks)
    assert type(throughput).__name__ == "ThroughputCallback"
    assert throughput.config.throughput.warmup_steps == 2
    assert throughput.config.output_dir == "/data/experiment-7/profiler"
    assert system.config == throughput.config  # so on one trainer they share one session
