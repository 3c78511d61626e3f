"""asrfit.utils.nnls against SciPy's NNLS (the independent reference) and closed forms."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import nnls as scipy_nnls

from asrfit.utils.nnls import nnls


def test_closed_forms() -> None:
    # unconstrained solution already non-negative: plain least squares
    a = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert nnls(a, np.array([2.0, 1.0, 1.0])) == pytest.approx([1.5, 1.0])
    # every coefficient would be negative: zero
    assert nnls(a, np.array([-1.0, -1.0, -1.0])).tolist() == [0.0, 0.0]
    # one clamped: y = 2 - x fitted with [1, x] >= 0 keeps the constant only
    x = np.arange(5.0)
    design = np.stack([np.ones_like(x), x], axis=1)
    sol = nnls(design, 2 - x)
    assert sol[1] == 0.0 and sol[0] == pytest.approx(np.mean(2 - x))


@pytest.mark.parametrize("seed", range(4))
def test_same_solution_as_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for trial in range(400):
        m, n = int(rng.integers(2, 12)), int(rng.integers(1, 7))  # under- and over-determined
        a = rng.normal(size=(m, n)) * rng.choice([1.0, 1e-3, 1e3], size=n)
        if trial % 3 == 0:
            a = np.abs(a)
        b = rng.normal(size=m) if trial % 2 else np.abs(rng.normal(size=m))
        expected = scipy_nnls(a, b)[0]
        got = nnls(a, b)
        assert (got >= 0).all()
        assert np.abs(got - expected).max() <= 1e-7 * max(1e-12, np.abs(expected).max()), (m, n)


def test_same_solution_as_scipy_on_peak_fits() -> None:
    # the planner's design: [1, B*T, B*T^2, U, B], rows scaled by the peak, columns to unit size
    rng = np.random.default_rng(7)
    for _ in range(300):
        t = rng.integers(1_000, 400_000, size=int(rng.choice([4, 7, 10])))
        b, u = rng.integers(1, 64, size=t.size), t // 1000
        x = np.stack([np.ones_like(t), b * t, b * t**2.0, u, b], axis=1).astype(float)
        y = 1.5e8 + rng.uniform(0, 1e4) * b * t + rng.uniform(0, 1e-2) * b * t**2.0 + 1e5 * u
        w = x / y[:, None]
        w /= np.abs(w).max(axis=0)
        expected = scipy_nnls(w, np.ones_like(y))[0]
        assert np.abs(nnls(w, np.ones_like(y)) - expected).max() <= 1e-7 * np.abs(expected).max()


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="shape"):
        nnls(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ValueError, match="finite"):
        nnls(np.array([[np.nan]]), np.ones(1))
