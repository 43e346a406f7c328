"""The hf engine's check of a weights version against the model it holds: every tensor
paired with the parameter (or buffer) it replaces, before anything is written.

Invariant: `plan_weight_update` raises ValueError (naming the tensor) on an unknown name, a
shape mismatch or a parameter left out, and writes nothing; the caller copies the plan in
(`HFEngine.load_weights`, under no_grad, in place).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def plan_weight_update(
    model: Any, items: list[tuple[str, torch.Tensor]]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pair each named tensor with the model tensor it replaces; raise before any write.

    Names are the model's parameter (or buffer) names. Tied parameters (lm_head.weight sharing the
    embedding) count as sent when any of their names is sent. Unknown names, shape
    mismatches and parameters left out are errors.
    """
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(model.named_buffers(remove_duplicate=False))
    plan, sent = [], set()
    for name, tensor in items:
        target = targets.get(name)
        if target is None:
            raise ValueError(f"weights version has unknown tensor {name!r}")
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"weights tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"model expects {tuple(target.shape)}"
            )
        plan.append((target.data, tensor))
        sent.add(id(target))
    missing = [n for n, p in model.named_parameters() if id(p) not in sent]
    if missing:
        raise ValueError(
            f"weights version is incomplete: {len(missing)} parameters missing, e.g. {missing[0]!r}"
        )
    return plan
