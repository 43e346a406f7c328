"""Bounded least squares: exact on small problems, always inside the box, KKT-optimal."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_stream.hardware.nnls import MAX_VARIABLES, bounded_lstsq


def _kkt_violation(a, y, x, upper):
    """Largest violation of the optimality conditions of min ||Ax - y||^2 on [0, upper]."""
    grad = a.T @ (a @ x - y)
    worst = 0.0
    for g, xi, hi in zip(grad, x, upper, strict=True):
        if xi <= 1e-9:
            worst = max(worst, -g)  # at the lower bound the gradient must not point inside
        elif xi >= hi - 1e-9:
            worst = max(worst, g)
        else:
            worst = max(worst, abs(g))
    return worst


def test_interior_solution_equals_ordinary_least_squares():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.1, 1.0, size=(20, 3))
    truth = np.array([2.0, 1.0, 0.5])
    x = bounded_lstsq(a, a @ truth)
    assert x == pytest.approx(truth, rel=1e-9)


def test_a_negative_unconstrained_component_is_held_at_zero():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = np.array([1.0, -2.0, -1.0])
    x = bounded_lstsq(a, y)
    assert x[1] == 0.0
    assert _kkt_violation(a, y, x, [np.inf, np.inf]) < 1e-9


def test_upper_bound_is_respected_and_optimal():
    a = np.eye(2)
    y = np.array([5.0, 0.5])
    x = bounded_lstsq(a, y, upper=np.array([1.0, 1.0]))
    assert x == pytest.approx([1.0, 0.5])


@pytest.mark.parametrize("seed", range(5))
def test_random_problems_satisfy_the_optimality_conditions(seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((12, 3))
    y = rng.standard_normal(12)
    upper = np.array([0.3, 10.0, 0.2])
    x = bounded_lstsq(a, y, upper)
    assert np.all(x >= 0)
    assert np.all(x <= upper)
    assert _kkt_violation(a, y, x, upper) < 1e-8


def test_too_many_variables_is_refused():
    with pytest.raises(ValueError, match="at most"):
        bounded_lstsq(np.ones((3, MAX_VARIABLES + 1)), np.ones(3))
