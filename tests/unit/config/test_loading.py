"""A mistyped `--set` key gets the nearest real setting in its one-line error."""

from __future__ import annotations

import pytest

from grpo_stream.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("trainer.lrr=1e-4", "trainer.lr"),  # a typo inside its section
        ("hub.max_stalenes=2", "hub.max_staleness"),
        ("generator.lr=1e-4", "trainer.lr"),  # the right name in the wrong section
        ("max_steps=10", "run.max_steps"),  # a setting without its section
        ("trainr.lr=1e-4", "trainer"),  # a misspelt section
        ('task.rewards=[{name="exact_match", wieght=2}]', "task.rewards.weight"),
    ],
)
def test_a_mistyped_key_gets_the_nearest_setting(typed: str, meant: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [typed])
    assert str(err.value).endswith(f"Extra inputs are not permitted (did you mean {meant}?)")


def test_a_key_close_to_nothing_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["zzz.qqq=1"])
    assert str(err.value) == "invalid config: zzz: Extra inputs are not permitted"
