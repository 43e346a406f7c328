"""Load a policy model and its tokenizer, the shipped tiny model or any Hugging Face model.

Invariants: the tiny model and real models take the same path (`from_pretrained` on a
directory or hub name), so what works on the tiny model works on a real one; tokenizers come
back left-padded with a pad token (batched generation needs both); "auto" dtype means
bfloat16 on GPUs and float32 on the CPU. transformers is imported inside functions so that
the CLI stays light. A trainable policy is in train mode (activation checkpointing only runs
there) with its dropout off unless asked (`prepare_training`): its log-probs are those of the
deterministic policy that generators sample.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from grpo_stream.config import DEFAULT_MODEL
from grpo_stream.progress import long_wait

if TYPE_CHECKING:
    import torch

Dtype = Literal["auto", "float32", "bfloat16", "float16"]

TINY_ASSET = "tiny-arith"
"""Directory under grpo_stream/assets that holds the built tiny model."""
SHIPPED_MODELS = {
    DEFAULT_MODEL: TINY_ASSET,
    "grpo-stream/tiny-guess": "tiny-guess",
    "grpo-stream/tiny-calc": "tiny-calc",
    "grpo-stream/tiny-judge": "tiny-judge",
    "grpo-stream/tiny-tools": "tiny-tools",
}
"""Model names that resolve to a directory under grpo_stream/assets (tiny-guess, tiny-calc:
the guess and calc environments' models, built by grpo_stream.builds.guess and
build_calc; tiny-judge: the arith judge of `name = "judge"` rewards, build_judge; tiny-tools:
calc through JSON function calls, grpo_stream.builds.tools)."""


def resolve_model(name_or_path: str) -> str:
    """The path of the shipped model for DEFAULT_MODEL; anything else unchanged.

    A name that is written as a filesystem path (absolute, ./, ../, ~) must exist: otherwise
    transformers would take it for a hub id and fail with a confusing message.
    """
    if name_or_path in SHIPPED_MODELS:
        return str(resources.files("grpo_stream").joinpath("assets", SHIPPED_MODELS[name_or_path]))
    if (
        name_or_path.startswith(("/", "./", "../", "~"))
        and not Path(name_or_path).expanduser().exists()
    ):
        raise FileNotFoundError(f"model path not found: {name_or_path}")
    return name_or_path


def torch_dtype(dtype: Dtype, device: str) -> torch.dtype:
    """The torch dtype for a setting: auto is bfloat16 on accelerators, float32 on the CPU."""
    import torch

    if dtype == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def _dtype_keyword() -> str:
    """`dtype` since transformers 4.56; `torch_dtype` before (which 5.x still accepts)."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def load_tokenizer(name_or_path: str) -> Any:
    """The model's tokenizer, left-padded, with a pad token (eos or unk when it had none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name_or_path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def vocab_size(name_or_path: str) -> int:
    """Rows of the model's input embedding, from its config (a token id at or past it would
    crash the forward)."""
    from transformers import AutoConfig

    config: Any = AutoConfig.from_pretrained(resolve_model(name_or_path))
    text = getattr(config, "text_config", None) or config
    size = getattr(text, "vocab_size", None)
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"{name_or_path}: its config has no vocab_size")
    return size


def load_policy(
    name_or_path: str,
    dtype: Dtype = "auto",
    device: str = "cpu",
    trainable: bool = True,
) -> Any:
    """An AutoModelForCausalLM on `device`: in train mode, or frozen in eval mode."""
    from transformers import AutoModelForCausalLM

    kwargs = {_dtype_keyword(): torch_dtype(dtype, device)}
    with long_wait("model.load", model=name_or_path, device=device):
        model: Any = AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), **kwargs)
        model.to(device)
    if trainable:
        model.train()
    else:
        model.eval()
        model.requires_grad_(False)
    return model


def disable_dropout(model: Any) -> None:
    """Zero every dropout probability (torch Dropout modules and the attention dropout of
    transformers' attention modules) while the model stays in train mode."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(vars(module).get("attention_dropout"), float):
            module.attention_dropout = 0.0


def supports_checkpointing(model: Any) -> bool:
    """Whether transformers can checkpoint this model's layers."""
    return bool(model.supports_gradient_checkpointing)


def enable_checkpointing(model: Any) -> None:
    """Activation checkpointing of every decoder layer, non-reentrant (transformers'
    `activation_checkpointing_enable`, `gradient_checkpointing_enable` before 5.x)."""
    if not supports_checkpointing(model):
        raise ValueError(
            f"trainer.gradient_checkpointing: {type(model).__name__} does not support "
            "activation checkpointing; set trainer.gradient_checkpointing=false"
        )
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def prepare_training(model: Any, dropout: bool, checkpointing: bool) -> None:
    """The trainable policy's forward: train mode, dropout off unless `dropout`, layers
    checkpointed when `checkpointing`."""
    model.train()
    if not dropout:
        disable_dropout(model)
    if checkpointing:
        enable_checkpointing(model)


def resolve_device(device: str | None) -> str:
    """`device` as given, or "cuda" when a GPU is visible, else "cpu"."""
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype_name(dtype: str, device: str) -> str:
    """The parameter dtype name for `ModelSettings.dtype`: auto is bf16 on GPUs, fp32 on CPU."""
    if dtype != "auto":
        return dtype
    return "float32" if device.startswith("cpu") else "bfloat16"
