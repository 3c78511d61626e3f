"""A cost model fitted to a handful of simulations, evaluated in microseconds by the planner.

For one model and setup, the traced peak of a padded batch of ``B`` utterances, each
``T`` input steps with ``U`` labels, is modelled as::

    peak(B, T, U) = c0 + B * (d + a * T + b * T**2 + c * U + e * T * U)

``c0`` holds what does not scale with the batch (parameters, gradients, optimizer state);
``d`` what every utterance costs whatever its length (Whisper pads every input to 30 s);
``a*T`` the activations linear in length; ``b*T**2`` attention scores and masks; ``c*U``
label-dependent tensors (CTC alignment lattices, decoder activations, transducer joints,
whose ``T*U`` cross term the ``U`` column approximates at fixed frames-per-label). The
fit is non-negative least squares on relative error, so small and large batches weigh
alike, and reports its residuals. Fitted on shapes whose labels grow with their length
(``U = r T``), the label columns cannot be told from the length columns: the fit is exact
on that line only. :func:`with_label_terms` moves it off the line with the label slopes
measured by pairs of traces that differ in ``U`` alone (``e * T * U`` is the cross term:
CTC lattices, transducer joints, cross-attention scores), which two-dimensional buckets
(duration x labels) need. Check a fit against fresh simulations at shapes not used for
fitting (``bench/memory_accuracy.py`` and the tests do).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from asrfit.utils.nnls import nnls
from asrfit.utils.serialization import JsonDataclass

Simulator = Callable[[int, int, int], int]


@dataclass
class PeakModel(JsonDataclass):
    """``peak(B, T, U) = c0 + B * (d + a*T + b*T^2 + c*U + e*T*U)`` with its fit residuals,
    and at least ``floor_bytes`` (:func:`fit_line_and_floor`: small batches that peak elsewhere).

    Attributes:
        c0_bytes: Batch-independent bytes.
        a_bytes_per_step: Bytes per utterance per input step.
        b_bytes_per_step2: Bytes per utterance per squared input step.
        c_bytes_per_label: Bytes per utterance per label.
        d_bytes_per_utterance: Bytes per utterance independent of its length.
        e_bytes_per_step_label: Bytes per utterance per input step per label (``T*U``).
        points: The ``(B, T, U, peak_bytes)`` points fitted.
        max_relative_residual: Largest |fit - simulated| / simulated over the points.
        floor_bytes: The least any batch is predicted (0: no floor).
    """

    c0_bytes: float
    a_bytes_per_step: float
    b_bytes_per_step2: float
    c_bytes_per_label: float
    d_bytes_per_utterance: float = 0.0
    e_bytes_per_step_label: float = 0.0
    points: list[list[int]] = field(default_factory=list)
    max_relative_residual: float = 0.0
    floor_bytes: float = 0.0

    def per_utterance(self, input_length: int, label_length: int) -> float:
        """Bytes the line adds per utterance of the batch."""
        t = float(input_length)
        return (
            self.d_bytes_per_utterance
            + self.a_bytes_per_step * t
            + self.b_bytes_per_step2 * t * t
            + self.c_bytes_per_label * label_length
            + self.e_bytes_per_step_label * t * label_length
        )

    def predict(self, batch_size: int, input_length: int, label_length: int) -> float:
        """Predicted peak bytes of a padded batch."""
        line = self.c0_bytes + batch_size * self.per_utterance(input_length, label_length)
        return max(line, self.floor_bytes)

    def max_batch(self, budget_bytes: float, input_length: int, label_length: int) -> int:
        """Largest batch whose predicted peak stays within ``budget_bytes`` (0 if none)."""
        per_utt = self.per_utterance(input_length, label_length)
        if per_utt <= 0 or self.floor_bytes > budget_bytes:
            return 0
        return max(0, int((budget_bytes - self.c0_bytes) // per_utt))


def _design(points: Iterable[tuple[int, int, int]]) -> np.ndarray:
    return np.array([[1.0, b * t, b * t * t, b * u, float(b)] for b, t, u in points], dtype=float)


def fit_peak_model(
    points: list[tuple[int, int, int, int]], *, never_under: bool = False
) -> PeakModel:
    """Fit the model to ``(B, T, U, peak_bytes)`` points (at least 4, with 2+ lengths).

    Args:
        points: Simulated ``(batch, input length, label length, peak bytes)``.
        never_under: Raise the constant by the largest shortfall, so that the fit predicts
            at least the simulated peak at every point (what a planner that must not run out
            of memory wants). (Default: False)

    Raises:
        ValueError: With fewer than 4 points.
    """
    if len(points) < 4:
        raise ValueError(f"fit_peak_model needs at least 4 simulated points, got {len(points)}.")
    x = _design((b, t, u) for b, t, u, _ in points)
    y = np.array([p for *_, p in points], dtype=float)
    # Relative error, columns scaled to unit size, non-negative coefficients (memory never
    # shrinks as a batch grows): Lawson-Hanson NNLS (asrfit.utils.nnls, no SciPy import).
    weighted = x / y[:, None]
    scale = np.abs(weighted).max(axis=0)
    scale[scale == 0] = 1.0
    coef = nnls(weighted / scale, np.ones_like(y))
    coef = coef / scale
    fitted = x @ coef
    if never_under:
        coef[0] += max(0.0, float(np.max(y - fitted)))
        fitted = x @ coef
    residual = float(np.max(np.abs(fitted - y) / y))
    return PeakModel(
        c0_bytes=float(coef[0]),
        a_bytes_per_step=float(coef[1]),
        b_bytes_per_step2=float(coef[2]),
        c_bytes_per_label=float(coef[3]),
        d_bytes_per_utterance=float(coef[4]),
        points=[[int(v) for v in p] for p in points],
        max_relative_residual=residual,
    )


def fit_line_and_floor(
    line_points: list[tuple[int, int, int, int]], other_points: list[tuple[int, int, int, int]]
) -> PeakModel:
    """A line fitted never under ``line_points``, raised to a floor at the ``other_points``
    above it: for a step whose small batches peak elsewhere (where the activations barely
    show) than the large ones near the budget, which one line cannot follow without passing
    far above the large ones.

    The floor is the largest peak among the ``other_points`` the line predicts below, so the
    model is never under any point of either list.

    Args:
        line_points: At least 4 points, on the branch where the batch decides the peak.
        other_points: Points the line need not pass above.
    """
    line = fit_peak_model(line_points, never_under=True)
    above = [p for b, t, u, p in other_points if line.predict(b, t, u) < p]
    every = [*line_points, *other_points]
    model = replace(line, floor_bytes=float(max(above, default=0)))
    residual = max(abs(model.predict(b, t, u) - p) / p for b, t, u, p in every)
    return replace(
        model, points=[[int(v) for v in p] for p in every], max_relative_residual=residual
    )


def default_fit_shapes(max_input_length: int, labels_per_step: float) -> list[tuple[int, int, int]]:
    """Five shapes spanning batch and length for a fit: two lengths at two batches, plus one."""
    long_t = max_input_length
    short_t = max(1, max_input_length // 3)
    mid_t = max(1, (2 * max_input_length) // 3)

    def u(t: int) -> int:
        return max(1, round(t * labels_per_step))

    return [
        (1, short_t, u(short_t)),
        (4, short_t, u(short_t)),
        (1, long_t, u(long_t)),
        (4, long_t, u(long_t)),
        (2, mid_t, u(mid_t)),
    ]


def fit_from_simulator(simulator: Simulator, shapes: list[tuple[int, int, int]]) -> PeakModel:
    """Run ``simulator(B, T, U) -> peak bytes`` on ``shapes`` and fit the model."""
    return fit_peak_model([(b, t, u, int(simulator(b, t, u))) for b, t, u in shapes])


#: :class:`PeakModel`'s coefficients (its fields other than the points and the residual).
COEFFICIENTS = (
    "c0_bytes",
    "a_bytes_per_step",
    "b_bytes_per_step2",
    "c_bytes_per_label",
    "d_bytes_per_utterance",
    "e_bytes_per_step_label",
)


def lerp_models(a: PeakModel, b: PeakModel, weight: float) -> PeakModel:
    """``(1 - weight) x a + weight x b``, coefficient by coefficient (no points, no floor)."""
    return PeakModel(
        **{n: (1 - weight) * getattr(a, n) + weight * getattr(b, n) for n in COEFFICIENTS}
    )


def subtract_models(a: PeakModel, b: PeakModel) -> PeakModel:
    """``a - b``, coefficient by coefficient (no points, and no floor: ``a``'s line lowered)."""
    return PeakModel(**{n: getattr(a, n) - getattr(b, n) for n in COEFFICIENTS})


def label_slopes(pairs: list[tuple[int, int, int, float, int, float]]) -> tuple[float, float]:
    """Per-utterance label terms ``(c, e)`` from pairs of shapes that differ in labels alone.

    Each pair ``(B, T, U_hi, y_hi, U_lo, y_lo)`` gives the slope per utterance and label at
    ``T``: ``(y_hi - y_lo) / (B (U_hi - U_lo)) = c + e T``; two lengths separate ``c`` from
    ``e``. Slopes are kept non-negative; when the two readings give a negative ``c`` or
    ``e``, the smaller reading is kept for all lengths: below the line ``U = r T`` (where
    two-dimensional buckets plan) a smaller slope predicts more memory, never less.

    Args:
        pairs: At least one pair; two at different ``T`` identify both terms.

    Returns:
        ``(c, e)``: bytes (or another unit) per utterance per label, and per step and label.

    Raises:
        ValueError: Without pairs, or on a pair whose label lengths are equal.
    """
    if not pairs:
        raise ValueError("label_slopes needs at least one pair of traces.")
    points = []
    for b, t, u_hi, y_hi, u_lo, y_lo in pairs:
        if u_hi == u_lo:
            raise ValueError(f"label_slopes: the pair at B={b}, T={t} has equal labels ({u_hi}).")
        points.append((float(t), (y_hi - y_lo) / (b * (u_hi - u_lo))))
    points = [(t, max(0.0, s)) for t, s in points]
    if len({t for t, _ in points}) < 2:
        return min(s for _, s in points), 0.0
    (t1, s1), (t2, s2) = sorted(points)[0], sorted(points)[-1]
    e = (s2 - s1) / (t2 - t1)
    c = s1 - e * t1
    if e < 0:
        return min(s for _, s in points), 0.0
    if c < 0:
        return 0.0, min(s / t for t, s in points)
    return c, e


def with_label_terms(model: PeakModel, labels_per_step: float, c: float, e: float) -> PeakModel:
    """``model`` with label terms ``c``, ``e``, unchanged on the line ``U = r T``.

    ``model`` was fitted on shapes with ``U = r T`` (``r = labels_per_step``), where its
    label and length columns cannot be told apart. The returned model predicts the same
    there and moves off the line with the measured slopes: per utterance,
    ``(c + e T) (U - r T)`` more (or less, below the line).
    """
    r = float(labels_per_step)
    return PeakModel(
        c0_bytes=model.c0_bytes,
        a_bytes_per_step=model.a_bytes_per_step + r * (model.c_bytes_per_label - c),
        b_bytes_per_step2=model.b_bytes_per_step2 + r * (model.e_bytes_per_step_label - e),
        c_bytes_per_label=c,
        d_bytes_per_utterance=model.d_bytes_per_utterance,
        e_bytes_per_step_label=e,
        points=model.points,
        max_relative_residual=model.max_relative_residual,
        floor_bytes=model.floor_bytes,
    )
