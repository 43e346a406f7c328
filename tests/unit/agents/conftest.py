"""Fixtures of the agent tests: tokenizers with tool-calling chat templates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grpo_stream.builds.tools import build_tools_tokenizer

HERE = Path(__file__).parent

NL = "{{- '\\n' -}}"
HERMES_TEMPLATE = (
    "{%- if tools -%}<|im_start|>system" + NL + "<tools>"
    "{%- for t in tools -%}"
    + NL
    + "{{- t | tojson -}}{%- endfor -%}"
    + NL
    + "</tools><|im_end|>"
    + NL
    + "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}<|im_start|>user"
    "{%- endif -%}" + NL + "<tool_response>" + NL + "{{- m.content -}}" + NL + "</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}<|im_end|>"
    + NL
    + "{%- endif -%}"
    "{%- elif m.role == 'assistant' -%}<|im_start|>assistant" + NL + "{{- m.content -}}"
    "{%- for c in m.tool_calls or [] -%}"
    + NL
    + "<tool_call>"
    + NL
    + "{{- {'name': c.function.name, 'arguments': c.function.arguments} | tojson -}}"
    + NL
    + "</tool_call>{%- endfor -%}<|im_end|>"
    + NL
    + "{%- else -%}<|im_start|>{{- m.role -}}"
    + NL
    + "{{- m.content -}}<|im_end|>"
    + NL
    + "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant" + NL + "{%- endif -%}"
)
"""A Qwen-style template written for these tests: tools in a system turn, consecutive tool
answers grouped in one user turn, <|im_end|> closing every turn."""


@pytest.fixture
def tools_tokenizer() -> Any:
    return build_tools_tokenizer()


@pytest.fixture
def hermes_tokenizer() -> Any:
    tok = build_tools_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = HERMES_TEMPLATE
    return tok


@pytest.fixture(autouse=True)
def _agents_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))  # agent workers take sys.path at start()
