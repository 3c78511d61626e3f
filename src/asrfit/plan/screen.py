"""Which setups earn a refined fit: screen all on coarse traces, refine the ones in contention.

A setup's memory fit is refined by traces at the largest batches that fit the budget
(:meth:`asrfit.plan.costs.CostEstimator.costs`); those traces are most of a plan's
simulations. The refinement is shared by the setups of one *group* (precision,
checkpointing, frozen encoder: the optimizers differ only by their optimizer trace).

1. Every setup is first planned on its group's coarse fit (four small traces) — its
   *coarse throughput*.
2. Groups are refined best coarse throughput first. A group is skipped when its best
   coarse throughput, raised by :data:`SCREEN_MARGIN`, is below the best refined throughput
   found so far, or when no setup of it fits even coarsely while another group fits.
3. If no setup fits coarsely, every group is refined (the exhaustive search).

The refined setups are planned exactly as the exhaustive search plans them (the same
traces, the same fits), so the winner's buckets are the exhaustive search's whenever the
winner is refined; ``python -m bench plan_speed`` (each case against its exhaustive plan)
and ``tests/test_plan_screen.py`` check the winner against the exhaustive search.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from asrfit.memory.setup import Setup

logger = logging.getLogger(__name__)

# How far a refined throughput may rise above its coarse estimate: coarse fits rest on
# batches of 2 and 4, where the peak is mostly model states, so they are optimistic on memory
# (larger batches); the step-time fit at those batches may err either way by a few %.
SCREEN_MARGIN = 0.10

Evaluate = Callable[[Setup, bool], tuple[Any, Any]]


def _group(setup: Setup) -> tuple:
    return (setup.precision, setup.gradient_checkpointing, setup.freeze_feature_encoder)


def refined(
    setups: list[Setup],
    evaluate: Evaluate,
    exhaustive: bool = False,
    on_skip: Callable[[], None] | None = None,
) -> list[tuple[Setup, Any, Any]]:
    """``(setup, costs, result)`` on refined fits for the setups in contention, in search order.

    Args:
        setups: The candidate setups, in the planner's order (which breaks ties).
        evaluate: ``(setup, refined) -> (costs, result)``; ``result`` is ``None`` when
            nothing fits, else ``(buckets, throughput, epoch seconds)``.
        exhaustive: Refine every setup (no screening).
        on_skip: Called once per group left unrefined (for progress).
    """
    groups: dict[tuple, list[Setup]] = {}
    for setup in setups:
        groups.setdefault(_group(setup), []).append(setup)
    bound: dict[tuple, float | None] = dict.fromkeys(groups)
    if not exhaustive:
        for key, members in groups.items():
            coarse = [evaluate(s, False)[1] for s in members]
            fits = [r[1] for r in coarse if r is not None]
            bound[key] = max(fits) if fits else None
    screening = not exhaustive and any(b is not None for b in bound.values())
    order = sorted(groups, key=lambda k: -(bound[k] or 0.0)) if screening else list(groups)
    done: dict[Setup, tuple[Any, Any]] = {}
    best = 0.0
    for key in order:
        if (
            screening
            and best > 0
            and (bound[key] is None or bound[key] * (1 + SCREEN_MARGIN) < best)
        ):
            logger.info("not refined: %s (coarse %s audio s/s, best %.1f)", key, bound[key], best)
            if on_skip is not None:
                on_skip()
            continue
        for setup in groups[key]:
            costs, result = evaluate(setup, True)
            done[setup] = (costs, result)
            if result is not None:
                best = max(best, result[1])
    return [(s, *done[s]) for s in setups if s in done]
