"""On-policy distillation: the per-token reverse-KL advantage of a teacher on the student's own
samples (Agarwal et al. 2024, GKD; the "on-policy distillation" of Lu & Thinking Machines 2025).

The student samples o ~ pi_S; the teacher scores every sampled token. The reverse KL
KL(pi_S || pi_T) = E_{o ~ pi_S}[sum_t log pi_S(o_t | o_<t) - log pi_T(o_t | o_<t)] has, at each
sampled token, the one-sample estimate log pi_S(o_t) - log pi_T(o_t); its negative is the
token's advantage, so the policy gradient lowers the reverse KL:

    A_t = (1 - w) * A_i + w * (log pi_T(o_t | x, o_<t) - log pi_S(o_t | x, o_<t))

where A_i is completion i's group-relative advantage from the rewards and w is
`algo.distill.weight`. log pi_S is the behaviour log-prob the generator sampled with (the
student as it sampled, at the sampling temperature); the teacher's is at the same temperature.

Invariants: every completion token gets exactly one advantage, in completion order; a
completion whose reward failed (invalid) gets 0 on every token, as it gets no sequence; the
reward term is the group's own advantage, unchanged (w = 0 gives the GRPO update).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def reverse_kl_advantages(
    teacher: npt.NDArray[np.float32], student: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """Per-token log pi_T - log pi_S: minus the one-sample estimate of the reverse KL."""
    if teacher.shape != student.shape:
        raise ValueError(f"teacher log-probs {teacher.shape} vs student {student.shape}")
    return (teacher.astype(np.float64) - student.astype(np.float64)).astype(np.float32)


def token_advantages(
    teacher: npt.NDArray[np.float32],
    student: npt.NDArray[np.float32],
    offsets: npt.NDArray[np.int64],
    advantages: npt.NDArray[np.float32],
    valid: npt.NDArray[np.bool_],
    weight: float,
) -> npt.NDArray[np.float32]:
    """The module doc's A_t for every completion token of one group: `teacher`, `student`
    (sum L,) log-probs, `offsets` (G+1,), `advantages` (G,) A_i, `valid` (G,)."""
    kl_adv = reverse_kl_advantages(teacher, student)  # (sum L,)
    bounds = np.asarray(offsets, dtype=np.int64)  # (G+1,)
    lengths = (bounds[1:] - bounds[:-1]).astype(np.int64)  # (G,)
    group_adv = np.repeat(np.asarray(advantages, dtype=np.float32), lengths)  # (sum L,)
    out = (1.0 - weight) * group_adv + weight * kl_adv
    out[np.repeat(~np.asarray(valid, dtype=bool), lengths)] = 0.0
    return out.astype(np.float32)


def mean_reverse_kl(teacher: npt.NDArray[np.float32], student: npt.NDArray[np.float32]) -> float:
    """The mean per-token estimate of KL(pi_S || pi_T) over a group's tokens (0.0 if none)."""
    if teacher.size == 0:
        return 0.0
    return float(np.mean(student.astype(np.float64) - teacher.astype(np.float64)))
