"""User code named `module:attribute` loads from the working directory, or fails in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grpo_stream.config.tasks import RewardSpec
from grpo_stream.rewards.registry import RewardLoadError, load_reward
from grpo_stream.rewards.sandbox import RewardPool
from grpo_stream.usercode import UserCodeError, import_object


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory that is not on sys.path (as for the `grpo-stream` script)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    return tmp_path


def _module(folder: Path, name: str, body: str) -> None:
    (folder / f"{name}.py").write_text(body)
    sys.modules.pop(name, None)


def test_a_module_in_the_working_directory_loads(workdir: Path) -> None:
    _module(workdir, "uc_rewards_a", "def nonempty(c, *, prompt, reference):\n    return 1.0\n")
    fn = load_reward(RewardSpec(name="uc_rewards_a:nonempty"))
    assert fn("x", prompt="p", reference={}) == 1.0


def test_a_missing_module_names_the_setting_and_where_it_looked(workdir: Path) -> None:
    with pytest.raises(RewardLoadError) as info:
        load_reward(RewardSpec(name="uc_nowhere:fn"))
    message = str(info.value)
    assert "\n" not in message
    assert "reward 'uc_nowhere:fn': cannot import uc_nowhere" in message
    assert str(workdir) in message


def test_a_module_that_raises_on_import_is_one_line(workdir: Path) -> None:
    _module(workdir, "uc_broken", "raise RuntimeError('no config here')\n")
    with pytest.raises(UserCodeError, match=r"^x = 1: importing uc_broken raised RuntimeError: "
                       r"no config here$"):  # fmt: skip
        import_object("uc_broken:fn", "x = 1")


def test_a_missing_attribute_and_a_malformed_spec_are_refused(workdir: Path) -> None:
    _module(workdir, "uc_rewards_b", "x = 1\n")
    with pytest.raises(UserCodeError, match="module uc_rewards_b has no 'fn'"):
        import_object("uc_rewards_b:fn", "s")
    with pytest.raises(UserCodeError, match=r"expected 'package\.module:attribute'"):
        import_object("uc_rewards_b", "s")


def test_the_scorers_sandboxed_workers_load_it_from_the_working_directory(workdir: Path) -> None:
    _module(workdir, "uc_rewards_c", "def two(c, *, prompt, reference):\n    return 2.0\n")
    pool = RewardPool(
        [RewardSpec(name="uc_rewards_c:two")], workers=1, timeout_s=30.0, memory_limit_mb=256
    )
    pool.start()
    try:
        result = pool.score("p", ["a", "b"], reference={})
    finally:
        pool.close()
    assert result.rewards.tolist() == [2.0, 2.0] and result.errors == []
