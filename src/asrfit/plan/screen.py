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

A group that checkpoints every layer is not even traced coarsely when its twin without
checkpointing (the same setups otherwise) is planned at the batch cap in every bucket: the
twin's group is refined first, and where each twin setup holds the cap everywhere, no
checkpointing can be faster. Checkpointing only frees memory for larger batches, which the cap
forbids, and it adds a forward pass of the layers to every step; any bucketing the
checkpointed setup could take, its twin takes with the same batches and shorter steps. Only
twins whose coarse plan is at the cap everywhere are refined early (the coarse fit is the
optimistic one), so the search is otherwise unchanged.

Nor is it traced where its twins' recompute bound holds
(:func:`asrfit.plan.checkpointing.recompute_bound`: no k of the encoder layers, nor every
layer, plans faster than the twin with the recompute they add and the memory they free at
most, both marked in the twin's own traces): first on the twins' coarse fits, then, only
where it holds there, on their refined ones.

The refined setups are planned exactly as the exhaustive search plans them (the same
traces, the same fits), so the winner's buckets are the exhaustive search's whenever the
winner is refined; ``python -m bench plan_speed`` (each case against its exhaustive plan)
and ``tests/test_plan_screen.py`` check the winner against the exhaustive search.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
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


def twin(setup: Setup) -> Setup:
    """``setup`` without gradient checkpointing (itself when it has none)."""
    return replace(setup, gradient_checkpointing=False)


def refined(
    setups: list[Setup],
    evaluate: Evaluate,
    exhaustive: bool = False,
    on_skip: Callable[[bool], None] | None = None,
    at_cap: Callable[[Any], bool] | None = None,
    cannot_win: Callable[[tuple[Any, Any]], bool] | None = None,
) -> list[tuple[Setup, Any, Any]]:
    """``(setup, costs, result)`` on refined fits for the setups in contention, in search order.

    Args:
        setups: The candidate setups, in the planner's order (which breaks ties).
        evaluate: ``(setup, refined) -> (costs, result)``; ``result`` is ``None`` when
            nothing fits, else ``(buckets, throughput, epoch seconds)``.
        exhaustive: Refine every setup (no screening).
        on_skip: Called once per group left unrefined (for progress), with whether it
            was left untraced altogether.
        at_cap: Whether a result holds the batch cap in every bucket (None: no cap); a
            checkpointing group whose twins all do is left out (module doc).
        cannot_win: Whether no checkpointing of a twin, given its ``(costs, result)``, can
            plan faster than it (None: not asked); a checkpointing group whose twins all
            pass it is left out (module doc).
    """
    groups: dict[tuple, list[Setup]] = {}
    for setup in setups:
        groups.setdefault(_group(setup), []).append(setup)
    done: dict[Setup, tuple[Any, Any]] = {}

    def refine(setup: Setup) -> Any:
        if setup not in done:
            done[setup] = evaluate(setup, True)
        return done[setup][1]

    def dominated(members: list[Setup]) -> bool:
        # each member's twin is planned, coarsely and then refined, at the cap everywhere
        if at_cap is None or not all(twin(s) in setups for s in members):
            return False
        twins = [twin(s) for s in members]
        return all(
            r is not None and at_cap(r) for r in (evaluate(t, False)[1] for t in twins)
        ) and all((r := refine(t)) is not None and at_cap(r) for t in twins)

    def recompute_dominated(members: list[Setup]) -> bool:
        # each member's twin fits, and no checkpointing beats it, coarsely and then refined
        if cannot_win is None or not all(twin(s) in setups for s in members):
            return False
        twins = [twin(s) for s in members]
        coarse = [evaluate(t, False) for t in twins]
        if not all(c[1] is not None and cannot_win(c) for c in coarse):
            return False
        return all(refine(t) is not None and cannot_win(done[t]) for t in twins)

    bound: dict[tuple, float | None] = dict.fromkeys(groups)
    left_out: set[tuple] = set()
    if not exhaustive:
        for key, members in sorted(groups.items(), key=lambda kv: kv[0][1]):  # twins first
            if key[1] and dominated(members):
                logger.info("not traced: %s (its twins hold the batch cap everywhere)", key)
                left_out.add(key)
                continue
            if key[1] and recompute_dominated(members):
                logger.info("not traced: %s (its recompute outweighs what it could gain)", key)
                left_out.add(key)
                continue
            coarse = [evaluate(s, False)[1] for s in members]
            fits = [r[1] for r in coarse if r is not None]
            bound[key] = max(fits) if fits else None
    screening = not exhaustive and any(b is not None for b in bound.values())
    order = sorted(groups, key=lambda k: -(bound[k] or 0.0)) if screening else list(groups)
    best = max((r[1] for _, r in done.values() if r is not None), default=0.0)
    for key in order:
        if key in left_out or (
            screening
            and best > 0
            and (bound[key] is None or bound[key] * (1 + SCREEN_MARGIN) < best)
        ):
            logger.info("not refined: %s (coarse %s audio s/s, best %.1f)", key, bound[key], best)
            if on_skip is not None:
                on_skip(key in left_out)
            continue
        for setup in groups[key]:
            result = refine(setup)
            if result is not None:
                best = max(best, result[1])
    return [(s, *done[s]) for s in setups if s in done]
