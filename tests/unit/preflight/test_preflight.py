"""Pre-flight: each bad input of a run is one line naming the setting, found before any
service starts; good inputs pass."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from huggingface_hub import constants

from grpo_stream.config import load_config
from grpo_stream.preflight import (
    PreflightError,
    check_agent,
    check_config_file,
    check_run_dir,
    find_model,
    preflight,
)

TINY = Path(__file__).resolve().parents[3] / "grpo_stream" / "assets" / "tiny-arith"


def _cfg(tmp_path: Path, *overrides: str):
    return load_config(None, [f'run.run_dir="{tmp_path / "run"}"', *overrides])


def test_default_run_passes_every_check_and_creates_nothing(tmp_path):
    lines = preflight(_cfg(tmp_path))
    assert [line.split(":")[0] for line in lines] == [
        "model",
        "data",
        "fit",
        "compatible",
        "run dir",
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("agent", "why"),
    [
        ("no_such_module_xyz:agent", "does not load: No module named 'no_such_module_xyz'"),
        ("grpo_stream.agents.calc:nope", "does not load"),
        ("grpo_stream.agents.calc:run_tool", "is not an async function"),
    ],
)
def test_an_agent_that_does_not_load_is_one_line_naming_env_agent(tmp_path, agent, why):
    with pytest.raises(PreflightError) as err:
        check_agent(_cfg(tmp_path, f'env.agent="{agent}"'))
    assert str(err.value).startswith(f"env.agent = {agent!r}") and why in str(err.value)


def test_the_shipped_agent_passes(tmp_path):
    line = check_agent(_cfg(tmp_path, 'env.agent="grpo_stream.agents.calc:calc_agent"'))
    assert line == "agent: grpo_stream.agents.calc:calc_agent (client openai)"


def test_an_agent_without_its_libraries_says_what_to_install(tmp_path, monkeypatch):
    from grpo_stream import preflight as module

    real = module.util.find_spec
    monkeypatch.setattr(module.util, "find_spec", lambda n: None if n == "openai" else real(n))
    with pytest.raises(PreflightError, match=r"env\.agent needs openai: pip install"):
        check_agent(_cfg(tmp_path, 'env.agent="grpo_stream.agents.calc:calc_agent"'))


def test_countdown_prompts_do_not_fit_the_tiny_models_context(tmp_path):
    with pytest.raises(PreflightError) as err:
        preflight(_cfg(tmp_path, "task.name=countdown"))
    message = str(err.value)
    assert "> 64" in message  # the tiny model's context
    assert "generator.max_tokens 8" in message
    assert "\n" not in message


def test_max_tokens_past_the_context_is_refused_with_the_sum(tmp_path):
    with pytest.raises(PreflightError, match=r"\+ generator.max_tokens 60 = \d+ > 64"):
        preflight(_cfg(tmp_path, "generator.max_tokens=60"))


def test_a_context_parallel_degree_that_divides_the_heads_passes(tmp_path):
    cfg = _cfg(tmp_path, "trainer.context_parallel=2", "trainer.ranks=2")
    lines = preflight(cfg)
    assert "context parallel: 2 ranks a sequence (2 heads, longest" in lines[3]


def test_a_context_parallel_degree_that_does_not_divide_the_heads_is_one_line(tmp_path):
    with pytest.raises(PreflightError) as err:
        preflight(_cfg(tmp_path, "trainer.context_parallel=3", "trainer.ranks=3"))
    message = str(err.value)
    assert message.startswith("trainer.context_parallel = 3 does not divide the 2 attention")
    assert "\n" not in message


def test_sequences_shorter_than_the_context_parallel_degree_are_refused(tmp_path):
    # the tiny model with 16 heads (pre-flight reads config.json and the tokenizer only)
    copy = tmp_path / "model"
    shutil.copytree(TINY, copy)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "num_attention_heads": 16}))
    sets = ["trainer.context_parallel=16", "trainer.ranks=16"]
    cfg = _cfg(tmp_path, f'model.name_or_path="{copy}"', "generator.max_tokens=1", *sets)
    with pytest.raises(PreflightError, match=r"longest sequence is \d+ tokens \(prompt \d+ \+ "):
        preflight(cfg)


def test_a_missing_local_model_path_is_named(tmp_path):
    with pytest.raises(PreflightError, match=r"name_or_path: \./no-such-model does not exist"):
        preflight(_cfg(tmp_path, 'model.name_or_path="./no-such-model"'))


def test_a_directory_without_config_json_is_not_a_model(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PreflightError, match=r"has no config\.json"):
        find_model(str(tmp_path / "empty"))


def test_a_local_model_directory_resolves_and_is_measured(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(TINY, copy)
    source = find_model(str(copy))
    assert source is not None and source.where == "local directory"
    with pytest.raises(PreflightError, match="> 64"):
        preflight(_cfg(tmp_path, f'model.name_or_path="{copy}"', "task.name=countdown"))


def _fake_cache(root: Path, name: str) -> Path:
    """The layout huggingface_hub writes for a downloaded model (refs/main -> snapshot)."""
    repo = root / f"models--{name.replace('/', '--')}"
    snapshot = repo / "snapshots" / "abc123"
    shutil.copytree(TINY, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    return snapshot


def test_a_name_in_the_local_hf_cache_resolves_without_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # unreachable
    snapshot = _fake_cache(tmp_path / "hub", "someorg/tiny")
    source = find_model("someorg/tiny")
    assert source is not None
    assert source.where == "Hugging Face cache" and source.path == snapshot


def test_offline_and_not_cached_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PreflightError, match="HF_HUB_OFFLINE is set: download it first"):
        find_model("someorg/absent")


def test_an_unreachable_hub_is_one_line_not_retries(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # connection refused
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(PreflightError, match="the hub is unreachable"):
        find_model("someorg/absent")


def test_a_name_that_is_no_repo_id_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(PreflightError, match="neither a local model directory"):
        find_model("a/b/c")


def test_a_missing_data_file_is_named(tmp_path):
    with pytest.raises(PreflightError, match=r"task\.path: no such file .*missing\.jsonl"):
        preflight(_cfg(tmp_path, "task.name=math", f'task.path="{tmp_path / "missing.jsonl"}"'))


def test_a_data_file_without_the_named_field_lists_its_fields(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"problem": "1+1", "answer": "2"}) + "\n")
    with pytest.raises(
        PreflightError, match=r"task.prompt_field: .* no column 'question'; columns: "
    ):
        preflight(_cfg(tmp_path, "task.name=math", f'task.path="{data}"'))


def test_a_good_data_file_is_measured_against_the_context(tmp_path):
    data = tmp_path / "d.jsonl"
    rows = [{"question": "x" * 100, "answer": "1"}, {"question": "1+1", "answer": "2"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(PreflightError, match="prompts do not fit"):
        preflight(_cfg(tmp_path, "task.name=math", f'task.path="{data}"'))


def test_a_config_directory_is_refused(tmp_path):
    with pytest.raises(PreflightError, match="is a directory"):
        check_config_file(tmp_path)


def test_a_run_dir_without_room_for_a_checkpoint_is_refused(tmp_path):
    with pytest.raises(PreflightError, match="MiB free, a checkpoint needs about"):
        check_run_dir(tmp_path / "run", need_bytes=2**62)


def test_a_run_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "run").write_text("")
    with pytest.raises(PreflightError, match="exists and is not a directory"):
        check_run_dir(tmp_path / "run", need_bytes=0)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_run_dir_is_refused(tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(PreflightError, match="not writable"):
            check_run_dir(tmp_path / "run", need_bytes=0)
    finally:
        tmp_path.chmod(0o755)


def test_a_chat_template_the_model_lacks_is_refused(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(TINY, copy)
    tok = json.loads((copy / "tokenizer_config.json").read_text())
    tok.pop("chat_template", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(tok))
    with pytest.raises(PreflightError, match="has no chat template"):
        preflight(_cfg(tmp_path, f'model.name_or_path="{copy}"', "task.chat_template=true"))


def test_a_model_on_other_hosts_is_not_required_for_a_lone_hub(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    lines = preflight(_cfg(tmp_path, 'model.name_or_path="someorg/elsewhere"'), local_model=False)
    assert lines[0] == "model: someorg/elsewhere (not here)"


def test_a_teacher_with_another_vocabulary_is_refused(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(TINY, other)
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    vocab["<extra>"] = len(vocab)
    (other / "tokenizer.json").write_text(json.dumps(data))
    cfg = _cfg(tmp_path, f'algo.distill.teacher="{other}"')
    with pytest.raises(PreflightError, match=r"does not share the vocabulary .* 1 entries differ"):
        preflight(cfg)


def test_a_missing_teacher_is_named_and_a_shipped_one_passes(tmp_path):
    with pytest.raises(PreflightError, match=r"algo\.distill\.teacher: /no/such/teacher"):
        preflight(_cfg(tmp_path, 'algo.distill.teacher="/no/such/teacher"'))
    lines = preflight(_cfg(tmp_path, 'algo.distill.teacher="grpo-stream/tiny-calc"'))
    assert any(line.startswith("teacher: grpo-stream/tiny-calc") for line in lines)
