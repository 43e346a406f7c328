"""The docs stay true to the code: the generated references are current and complete, the
site builds strictly, the README stays a front page, and every setting, class and function the
hand-written pages name exists."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
import typer.main
from pydantic import BaseModel, ConfigDict, Field

from grpo_stream.algo.regularizer import GradRegularizer
from grpo_stream.cli.main import app
from grpo_stream.config import RunConfig
from grpo_stream.config.algo import RegularizerSettings
from grpo_stream.tasks import make_task

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SETTINGS_PAGE = DOCS / "reference" / "settings.md"
GENERATED = {"settings.md", "cli.md", "trl.md"}


sys.path.insert(0, str(ROOT / "scripts"))  # the generator's modules (scripts/ is no package)
import reference_settings  # noqa: E402
import reference_trl  # noqa: E402


def test_generated_references_are_current() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_reference.py", "--check"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


# ----- every setting, read from pydantic's JSON schema (not the generator's walk) ---------


def _schema_settings(
    schema: dict[str, Any], node: dict[str, Any], prefix: str
) -> list[tuple[str, dict[str, Any]]]:
    """(dotted path, property schema) of every setting under `node`: a property whose schema
    is an object (a $ref) is a section; an array or optional of objects is a setting whose
    objects' properties follow under `path[]` or `path`."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name, prop in node.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        ref = prop.get("$ref")
        if ref is not None:
            out += _schema_settings(schema, _resolve(schema, ref), path)
            continue
        out.append((path, prop))
        for option in prop.get("anyOf", [prop]):
            items = option.get("items", {})
            if "$ref" in option:
                out += _schema_settings(schema, _resolve(schema, option["$ref"]), path)
            elif "$ref" in items:
                out += _schema_settings(schema, _resolve(schema, items["$ref"]), path + "[]")
    return out


def _resolve(schema: dict[str, Any], ref: str) -> dict[str, Any]:
    resolved: dict[str, Any] = schema["$defs"][ref.rsplit("/", 1)[1]]
    return resolved


def _rows(page: str) -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in page.splitlines():
        found = re.match(r"\| `([^`]+)` \|", line)
        if found:
            rows.setdefault(found.group(1), line)
    return rows


def _unescaped(markdown: str) -> str:
    """A generated row as it reads once rendered (the generator escapes what Markdown would
    take for markup)."""
    for escaped, plain in (("\\|", "|"), ("\\*", "*"), ("\\[", "["), ("&lt;", "<")):
        markdown = markdown.replace(escaped, plain)
    return markdown


def _bounds(prop: dict[str, Any]) -> list[str]:
    signs = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
    out = []
    for option in prop.get("anyOf", [prop]):
        out += [f"{sign} {option[key]!r}" for key, sign in signs.items() if key in option]
    return out


def test_every_setting_of_run_config_appears_with_its_docstring_and_range() -> None:
    schema = RunConfig.model_json_schema(by_alias=True)
    settings = _schema_settings(schema, schema, "")
    rows = _rows(SETTINGS_PAGE.read_text(encoding="utf-8"))
    assert len(settings) > 200  # the walk reached the nested sections
    missing = [path for path, _ in settings if path not in rows]
    assert not missing, f"settings not in docs/reference/settings.md: {missing}"
    for path, prop in settings:
        row = _unescaped(rows[path])
        words = " ".join(str(prop["description"]).split())[:40]
        assert words in row, f"{path}: its docstring is not in its row: {row}"
        for bound in _bounds(prop):
            assert bound in row, f"{path}: range {bound} missing from its row: {row}"


class _Inner(BaseModel):
    """A new nested section."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    depth: int = Field(3, ge=1, le=9)
    """How deep."""


class _Item(BaseModel):
    """One entry of a list."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    label: str = "x"
    """The entry's label."""


class _NewSection(BaseModel):
    """A section another change adds."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    mode: Literal["fast", "slow"] = "fast"
    """Which way."""
    inner: _Inner = _Inner()
    """The nested section."""
    items: list[_Item] = []
    """Entries."""
    maybe: _Inner | None = None
    """An optional section."""


class _Root(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    added: _NewSection = _NewSection()
    """Added by another branch."""


def test_the_settings_walk_picks_up_new_sections_lists_and_optionals() -> None:
    page = reference_settings.settings_page(_Root, _Item)
    rows = _rows(page)
    for path in ("added.mode", "added.inner.depth", "added.items", "added.items[].label",
                 "added.maybe", "added.maybe.depth"):  # fmt: skip
        assert path in rows, path
    assert '"fast" \\| "slow"' in rows["added.mode"]
    assert ">= 1, <= 9" in rows["added.inner.depth"]


def test_a_setting_without_a_docstring_stops_the_generator() -> None:
    class Bare(BaseModel):
        model_config = ConfigDict(use_attribute_docstrings=True)
        knob: int = 1

    with pytest.raises(reference_settings.UndocumentedSetting, match=r"Bare\.knob"):
        reference_settings.settings_page(Bare, _Item)


# ----- every command and option ------------------------------------------------------------


def test_every_cli_command_and_option_appears() -> None:
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")

    def walk(group: Any, prefix: str) -> list[tuple[str, Any]]:
        found = []
        for name, command in group.commands.items():
            found.append((f"{prefix} {name}", command))
            if hasattr(command, "commands"):
                found += walk(command, f"{prefix} {name}")
        return found

    commands = walk(typer.main.get_command(app), "grpo-stream")
    assert len(commands) >= 10
    for path, command in commands:
        assert f"## `{path}`" in page, path
        for param in command.params:
            names = param.opts if param.param_type_name == "option" else [param.name.upper()]
            for name in names:
                assert f"`{name}`" in page, f"{path} {name}"


# ----- TRL ---------------------------------------------------------------------------------


def test_the_trl_table_names_only_real_settings() -> None:
    reference_trl.TRL_GRPO["epsilon"] = ("algo.loss.no_such_setting", "")
    try:
        with pytest.raises(KeyError, match="no_such_setting"):
            reference_trl.trl_page(RunConfig)
    finally:
        reference_trl.TRL_GRPO["epsilon"] = ("algo.loss.eps_low", "")


@pytest.mark.slow  # importing trl takes 20-30 s
def test_the_trl_table_covers_grpo_config_exactly() -> None:
    pytest.importorskip("trl", reason="trl is in the bench extra")
    assert reference_trl.trl_fields_not_mapped() == ([], [])


# ----- the site and the front page -----------------------------------------------------------


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's end-of-life notice
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "reference" / "protocol" / "index.html").is_file()


def test_the_readme_is_a_front_page_that_stays_in_the_repository() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert "http://" not in text and "https://" not in text
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), f"README links to {target}, which is not there"


# ----- names on the hand-written pages -------------------------------------------------------

PAGES = [
    *sorted(p for p in DOCS.rglob("*.md") if p.name not in GENERATED),
    ROOT / "README.md",
    ROOT / "examples" / "README.md",
]


def _definitions() -> tuple[dict[str, set[str]], set[str]]:
    """({class: its methods}, every function and field name and string constant) in
    grpo_stream, services and protocols: what a `snake_case` name on a page may be."""
    classes: dict[str, set[str]] = {}
    functions: set[str] = set()
    for folder in ("grpo_stream", "services", "protocols"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, set()).update(
                        n.name for n in node.body if isinstance(n, ast.FunctionDef)
                    )
                elif isinstance(node, ast.FunctionDef):
                    functions.add(node.name)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    functions.add(node.value)  # a metric column or a field (`groups_filtered`)
                elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    functions.add(node.target.id)
    return classes, functions


def _setting_paths() -> set[str]:
    schema = RunConfig.model_json_schema(by_alias=True)
    paths = {path for path, _ in _schema_settings(schema, schema, "")}
    return paths | {p.rsplit(".", 1)[0] for p in paths}  # sections too


EVENT = r"(?:\.(?:debug|info|warning|error|exception)|\bemit)\(\s*\"([a-z_.]+)\""
"""A structured-log call (or a rate-limited `emit` of one) and its event name."""


def _log_events() -> set[str]:
    """Every structured-log event name the code emits (`log.info("hub.stall", ...)`)."""
    events: set[str] = set()
    for folder in ("grpo_stream", "services", "protocols"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            events.update(re.findall(EVENT, text))
    return events


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_settings_named_on_a_page_exist(page: Path) -> None:
    """A `section.key` on a page is a real setting; log events (`hub.stall`) and file names
    (`hub.py`) share the look and are told apart."""
    sections = set(RunConfig.model_fields)
    known = _setting_paths() | _log_events()
    named = re.findall(r"`([a-z_]+(?:\.[a-z_0-9]+)+)`", page.read_text(encoding="utf-8"))
    suffixes = ("py", "md", "json", "toml", "jsonl", "secret", "example")
    files = {n for n in named if n.rsplit(".", 1)[1] in suffixes}
    wrong = sorted({n for n in named if n.split(".")[0] in sections} - known - files)
    assert not wrong, f"{page.name} names settings that do not exist: {wrong}"


def test_the_tours_classes_methods_and_functions_exist() -> None:
    text = (DOCS / "tour.md").read_text(encoding="utf-8")
    classes, functions = _definitions()
    methods = set(re.findall(r"\b([A-Z][A-Za-z]+)\.([a-z_][a-z_0-9]*)\b", text))
    named = set(re.findall(r"`([a-z]+_[a-z_0-9]+)`", text)) - {
        name.split(".")[-1] for name in _setting_paths()
    }
    assert len(methods) >= 12
    for cls, method in sorted(methods):
        assert method in classes.get(cls, set()), f"{cls}.{method} is not defined"
    for name in sorted(named):
        assert name in functions, f"{name} is neither a function nor a name the code uses"
    shown = re.search(
        r"Problem\(index=(\d+), prompt=\"(.*?)\", reference=\{\"answer\": \"(.*?)\"\}\)", text
    )
    assert shown is not None
    problem = make_task(RunConfig().task).problem(int(shown.group(1)))
    assert (problem.prompt, problem.reference) == (shown.group(2), {"answer": shown.group(3)})


def test_the_regularizer_worked_example_is_what_the_code_does() -> None:
    """docs/guide/off-policy.md's table: each row a fresh regularizer at the defaults and
    tau = 1, given a gradient of norm n."""
    text = (DOCS / "guide" / "off-policy.md").read_text(encoding="utf-8")
    table = text[text.index("A worked example") :].split("\n\n")[1]
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    assert len(rows) == 4
    for n_cell, _, after_cell, tau_cell in rows:
        n = float(n_cell)
        param = torch.nn.Parameter(torch.zeros(2))
        param.grad = torch.tensor([n * 0.6, n * 0.8])  # norm n
        reg = GradRegularizer(RegularizerSettings(tau0=1.0))
        stats = reg.apply([param])
        tau_after = float(tau_cell.split()[0])
        assert reg.tau == pytest.approx(tau_after), (n, reg.tau)
        if "skipped" in after_cell:
            assert stats.exploded and stats.skip == "explosion"
        else:
            assert stats.norm_after == pytest.approx(float(after_cell))
            assert float(param.grad.norm()) == pytest.approx(float(after_cell), rel=1e-6)
