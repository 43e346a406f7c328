"""Settings of on-policy distillation: the teacher model and its weight in the advantage
(`algo.distill`), and the teacher service that scores completions with it (`teacher`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DistillSettings(BaseModel):
    """On-policy distillation (grpo_stream.algo.distill): a teacher's per-token log-probs on
    the student's own samples give each token the advantage
    A_t = (1 - weight) * A_group + weight * (log p_teacher(o_t) - log p_student(o_t))."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    teacher: str | None = None
    """The teacher: a Hugging Face model name or local path sharing the policy's tokenizer
    (token ids are scored as they are); None turns distillation off (no teacher starts)."""
    weight: float = Field(1.0, ge=0, le=1)
    """Share of the per-token reverse-KL advantage: 1 distils alone, 0 trains on the rewards
    alone (the teacher still runs and its KL is logged), between mixes the two."""


class TeacherSettings(BaseModel):
    """Teacher services: score completion tokens with algo.distill.teacher."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    count: int = Field(1, ge=1)
    """Teacher processes that `up` starts when algo.distill.teacher is set."""
    engine: Literal["hf", "vllm"] = "hf"
    """hf (a transformers forward, CPU or GPU) or vllm (prompt log-probs; `grpo-stream[vllm]`,
    needs generator.temperature = 1: vLLM reports them untempered)."""
    device: str | None = None
    """hf: the teacher's device (cpu, cuda, cuda:1); None: a GPU when one is visible (placement
    gives teachers the GPUs its plan leaves idle)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype: auto is bfloat16 on GPUs and float32 on CPU; log-probs are float32."""
    groups_per_request: int = Field(4, ge=1)
    """Groups a teacher asks for at once (its credits)."""
    timeout_s: float = Field(60.0, gt=0)
    """A group not answered in this time goes to another teacher (or the same one again)."""
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1)
    """vllm: fraction of device memory for weights and KV cache."""


def check_distill_config(
    distill: DistillSettings,
    teacher: TeacherSettings,
    temperature: float,
    episodes: bool,
    direct_payloads: bool,
) -> None:
    """Cross-section checks of a distillation run (raised as one line naming the setting)."""
    if distill.teacher is None:
        return
    if episodes:
        raise ValueError(
            "algo.distill.teacher scores single-turn completions: unset it with env.name "
            "(an episode's environment tokens have no teacher log-probs)"
        )
    if direct_payloads:
        raise ValueError(
            "algo.distill.teacher needs hub.payloads = 'hub' (teachers score the token ids "
            "the hub holds)"
        )
    if teacher.engine == "vllm" and temperature != 1.0:
        raise ValueError(
            f"teacher.engine = 'vllm' reports untempered log-probs: it needs "
            f"generator.temperature = 1 (got {temperature}); use teacher.engine = 'hf'"
        )
