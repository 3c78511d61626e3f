"""Non-negative least squares for the small fits of a plan, without importing SciPy.

A plan fits a handful of coefficients (at most a few dozen points); ``scipy.optimize`` takes
0.3-0.7 s to import, about a tenth of a warm plan. :func:`nnls` is the active-set method of
Lawson and Hanson ("Solving Least Squares Problems", 1974, chapter 23), the algorithm behind
``scipy.optimize.nnls``: variables enter the passive set by largest gradient, and an
interior step moves back to feasibility whenever the unconstrained solution on the passive
set has a non-positive coefficient.
"""

from __future__ import annotations

import numpy as np


def nnls(a: np.ndarray, b: np.ndarray, *, max_iter: int | None = None) -> np.ndarray:
    """``argmin_x ||a x - b||_2`` subject to ``x >= 0``.

    Args:
        a: ``(m, n)`` design matrix.
        b: ``(m,)`` target.
        max_iter: Outer iterations allowed (Default: ``3 n``, as SciPy); each may take
            as many inner (feasibility) steps as the passive set has variables.

    Returns:
        The ``(n,)`` solution.

    Raises:
        ValueError: On mismatched shapes or non-finite input.
        RuntimeError: When the iteration limit is reached.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64).reshape(-1)
    if a.ndim != 2 or a.shape[0] != b.shape[0]:
        raise ValueError(
            f"nnls: a has shape {a.shape}, b has shape {b.shape}; want (m, n) and (m,)."
        )
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("nnls: a and b must be finite.")
    n = a.shape[1]
    limit = max_iter or 3 * n
    # rounding error of a^T r at a solved residual: a gradient below it is noise
    tol = 10 * max(a.shape) * np.finfo(np.float64).eps * np.linalg.norm(a) * np.linalg.norm(b)
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    iterations = 0

    def solve(mask: np.ndarray) -> np.ndarray:
        s = np.zeros(n)
        s[mask] = np.linalg.lstsq(a[:, mask], b, rcond=None)[0]
        return s

    residual = float(np.linalg.norm(b))
    while (~passive).any() and float(np.max(np.where(passive, -np.inf, w))) > tol:
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        before = (x.copy(), passive.copy())
        passive[j] = True
        s = solve(passive)
        for _ in range(n + 1):  # each step drops at least one variable
            if not passive.any() or float(s[passive].min()) > 0:
                break
            blocking = np.flatnonzero(passive & (s <= 0))
            ratios = x[blocking] / (x[blocking] - s[blocking])
            alpha = float(ratios.min())
            x = x + alpha * (s - x)
            x[blocking[int(np.argmin(ratios))]] = 0.0  # the variable that hit its bound
            passive &= x > 10 * np.finfo(np.float64).eps * max(1.0, float(np.abs(x).max()))
            x[~passive] = 0.0
            s = solve(passive)
        now = float(np.linalg.norm(a @ s - b))
        if not passive[j] and now >= residual * (1 - 1e-12):
            x, passive = before  # j's gradient was rounding noise: it left at once, nothing gained
            break
        x, residual = s, now
        w = a.T @ (b - a @ x)
        iterations += 1
        if iterations > limit:
            raise RuntimeError(f"nnls: no solution within {limit} iterations.")
    return x
