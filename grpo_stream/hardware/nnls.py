"""Box-constrained linear least squares, small and exact (scipy is not a dependency).

    minimise ||A x - y||^2  subject to  0 <= x <= upper

The problem is convex, so its minimiser is the unconstrained least-squares solution on
some set of free variables with every other variable held at one of its bounds. For the
handful of variables the score has (3), trying every assignment of each variable to
{lower, upper, free} (3^n least-squares solves, 27 for n = 3) and keeping the best
feasible one is exact and needs no step sizes or tolerances to tune. Invariant: the result
is always feasible (all variables at the lower bound is a candidate).
"""

from __future__ import annotations

import itertools

import numpy as np
from numpy.typing import NDArray

MAX_VARIABLES = 8
"""3^8 = 6561 small solves; past this an iterative method would be the right tool."""

_LOW, _HIGH, _FREE = 0, 1, 2


def bounded_lstsq(
    a: NDArray[np.float64], y: NDArray[np.float64], upper: NDArray[np.float64] | None = None
) -> NDArray[np.float64]:
    """x minimising ||a x - y|| with 0 <= x <= upper (upper None: no upper bound).

    a: (m, n), y: (m,), upper: (n,) with positive entries or inf.
    """
    a = np.asarray(a, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    m, n = a.shape
    if y.shape != (m,):
        raise ValueError(f"y has shape {y.shape}, expected ({m},)")
    if n > MAX_VARIABLES:
        raise ValueError(f"bounded_lstsq handles at most {MAX_VARIABLES} variables, got {n}")
    hi = np.full(n, np.inf) if upper is None else np.asarray(upper, dtype=np.float64)
    if hi.shape != (n,) or np.any(hi <= 0):
        raise ValueError("upper must have one positive entry per variable")
    states = (_LOW, _FREE) if np.all(np.isinf(hi)) else (_LOW, _HIGH, _FREE)
    tol = 1e-9 * max(1.0, float(np.max(np.abs(hi[np.isfinite(hi)]), initial=1.0)))
    best, best_cost = np.zeros(n), float(y @ y)
    for assignment in itertools.product(states, repeat=n):
        x = _candidate(a, y, hi, assignment, tol)
        if x is None:
            continue
        r = a @ x - y
        cost = float(r @ r)
        if cost < best_cost - 1e-12 * max(1.0, best_cost):
            best, best_cost = x, cost
    return best


def _candidate(
    a: NDArray[np.float64],
    y: NDArray[np.float64],
    hi: NDArray[np.float64],
    assignment: tuple[int, ...],
    tol: float,
) -> NDArray[np.float64] | None:
    """The least-squares x for one bound assignment, or None when it leaves the box."""
    x = np.zeros(len(assignment))
    for i, state in enumerate(assignment):
        if state == _HIGH:
            if np.isinf(hi[i]):
                return None
            x[i] = hi[i]
    free = [i for i, state in enumerate(assignment) if state == _FREE]
    if not free:
        return x
    sol = np.linalg.lstsq(a[:, free], y - a @ x, rcond=None)[0]
    if np.any(sol < -tol) or np.any(sol > hi[free] + tol):
        return None
    x[free] = np.clip(sol, 0.0, hi[free])
    return x
