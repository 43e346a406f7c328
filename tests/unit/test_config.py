"""Run config: TOML, overrides, one clear error line naming the field."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from grpo_stream.config import ConfigError, RunConfig, config_from_dict, load_config


def test_defaults_are_the_embedded_tiny_run() -> None:
    cfg = load_config()
    assert cfg.model.name_or_path == "grpo-stream/tiny-arith"
    assert cfg.task.name == "arith" and cfg.generator.engine == "hf"


def test_overrides_are_parsed_as_toml_values() -> None:
    cfg = load_config(
        None, ["trainer.lr=1e-3", "hub.max_staleness=0", "algo.loss.aggregation=dapo"]
    )
    assert cfg.trainer.lr == 1e-3 and cfg.hub.max_staleness == 0
    assert cfg.algo.loss.aggregation == "dapo"


def test_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("[generator]\ngroup_size = 4\n[trainer]\nlr = 0.5\n")
    cfg = load_config(path, ["trainer.lr=0.25"])
    assert cfg.generator.group_size == 4 and cfg.trainer.lr == 0.25


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("generator.group_size=0", "generator.group_size"),
        ("trainer.lr=-1", "trainer.lr"),
        ("hub.nope=1", "hub.nope"),
        ('generator.engine="tgi"', "generator.engine"),
    ],
)
def test_invalid_value_names_the_field(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert field in str(err.value) and "\n" not in str(err.value)


def test_cross_field_check_groups_per_step_vs_ranks() -> None:
    with pytest.raises(ConfigError, match=r"groups_per_step must be at least trainer\.ranks"):
        load_config(None, ["hub.groups_per_step=2", "trainer.ranks=4"])
    assert load_config(None, ["hub.groups_per_step=4", "trainer.ranks=4"]).trainer.ranks == 4


def test_direct_payloads_on_several_ranks_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"hub\.payloads = 'direct' needs trainer\.ranks = 1"):
        load_config(None, ["hub.payloads=direct", "trainer.ranks=2", "hub.groups_per_step=4"])
    assert load_config(None, ["hub.payloads=direct"]).hub.payloads == "direct"


def test_several_minibatches_on_several_ranks_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"trainer\.minibatches > 1 needs trainer\.ranks = 1"):
        load_config(None, ["trainer.minibatches=4", "trainer.ranks=2", "hub.groups_per_step=4"])
    assert load_config(None, ["trainer.minibatches=4"]).trainer.minibatches == 4


def test_a_context_parallel_degree_that_does_not_divide_the_ranks_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"context_parallel = 2 must divide trainer\.ranks = 3"):
        load_config(None, ["trainer.context_parallel=2", "trainer.ranks=3"])
    cfg = load_config(None, ["trainer.context_parallel=2", "trainer.ranks=4"])
    assert cfg.trainer.data_ranks == 2


def test_context_parallel_groups_need_a_group_of_the_step_each_not_every_rank() -> None:
    # 4 ranks in 2 context groups train 2 shards of a step: 2 groups per step suffice
    sets = ["trainer.context_parallel=2", "trainer.ranks=4", "hub.groups_per_step=2"]
    assert load_config(None, sets).hub.groups_per_step == 2
    with pytest.raises(ConfigError, match="groups_per_step must be at least"):
        load_config(None, ["trainer.ranks=4", "hub.groups_per_step=2"])


def test_cross_field_check_capacity_vs_batch() -> None:
    with pytest.raises(ConfigError, match="capacity"):
        load_config(None, ["hub.groups_per_step=64", "hub.replay.capacity=8"])


def test_missing_file_and_bad_toml_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[run\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad)


def test_override_without_equals_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        load_config(None, ["trainer.lr"])


def test_resolved_toml_round_trips() -> None:
    cfg = load_config(None, ['task.rewards=[{name="exact_match", weight=2.0}]', "run.max_steps=7"])
    again = config_from_dict(tomllib.loads(cfg.to_toml()))
    assert again == cfg and again.digest() == cfg.digest()


def test_every_field_is_documented() -> None:
    def undocumented(model: type, prefix: str) -> list[str]:
        missing = []
        for name, info in model.model_fields.items():  # type: ignore[attr-defined]
            if not info.description:
                missing.append(prefix + name)
            ann = info.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                missing += undocumented(ann, f"{prefix}{name}.")
        return missing

    assert undocumented(RunConfig, "") == []


@pytest.mark.parametrize("name", ["qwen-gsm8k.toml"])
def test_shipped_examples_validate(name: str) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / name
    cfg = load_config(path)
    assert cfg.generator.engine == "vllm" and cfg.task.name == "dataset"


def test_top_p_below_one_is_refused_with_one_line() -> None:
    # the trainer's log-probs are the full tempered softmax; a nucleus sample's are not
    with pytest.raises(ConfigError, match=r"generator: .*top_p < 1 is not supported") as err:
        load_config(None, ["generator.top_p=0.9"])
    assert "\n" not in str(err.value)


def test_inflight_updates_with_vllm_are_a_valid_config() -> None:
    overrides = ["generator.engine=vllm", "generator.inflight_updates=true"]
    assert load_config(None, overrides).generator.inflight_updates


def test_lora_without_an_lr_trains_at_the_lora_lr() -> None:
    from grpo_stream.config.lora import LORA_LR

    assert load_config(None, ["trainer.lora.enabled=true"]).trainer.lr == LORA_LR
    assert load_config(None, []).trainer.lr == 1e-4  # full fine-tuning keeps its default


def test_lora_with_an_lr_given_keeps_it() -> None:
    assert load_config(None, ["trainer.lora.enabled=true", "trainer.lr=5e-4"]).trainer.lr == 5e-4


def test_the_resolved_file_of_a_lora_run_has_the_same_lr_and_digest(tmp_path: Path) -> None:
    cfg = load_config(None, ["trainer.lora.enabled=true"])
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml())
    again = load_config(path)
    assert (again.trainer.lr, again.digest()) == (cfg.trainer.lr, cfg.digest())
