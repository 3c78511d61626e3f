"""What keeps ``asrfit train`` whole across bad data and kills: the cleaned manifest the planner profiles, ``--save-every``, the best-model folder's atomic write and recovery and
the run state that remembers which epochs were scored.

A kill (``kill -9``, a power cut) can land anywhere; what a restart with ``--resume`` finds:

* inside a checkpoint write: the temporary file (removed at start), the previous checkpoint
  whole;
* inside the best-model write: ``best.tmp`` (incomplete without ``scores.json``: removed;
  complete: it becomes ``best``) and maybe ``best.old`` (the previous best: restored when
  ``best`` is missing, else removed);
* after an epoch's checkpoint but before its dev score was recorded: ``run_state.json``
  does not list that step, so the epoch is scored again from the checkpoint's weights.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asrfit.data.text import CharVocabulary
from asrfit.errors import ConfigError, DiskFullError
from asrfit.models.hub import write_model_card, write_remote_code, write_tokenizer_code
from asrfit.plan.long_audio import long_audio_cap_seconds
from asrfit.utils.io import atomic_write_text, disk_full_reason

logger = logging.getLogger(__name__)


def parse_save_every(value: str | int | None) -> tuple[int | None, float | None]:
    """``"500"`` -> every 500 steps; ``"30m"`` / ``"30min"`` -> every 30 minutes; ``"0"`` -> never.

    Raises:
        ConfigError: For anything else.
    """
    text = str(value if value is not None else "0").strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(m|min|minutes?)?", text)
    if match is None:
        raise ConfigError(f"save_every={value!r}: give steps (500) or minutes (30m).")
    number, unit = float(match.group(1)), match.group(2)
    if unit:
        return None, (number or None)
    if number != int(number):
        raise ConfigError(
            f"save_every={value!r}: steps must be a whole number (or add 'm' for minutes)."
        )
    return (int(number) or None), None


def recover_best(best: Path) -> None:
    """Put the best-model folder back together after a kill during its write (see above)."""
    tmp, old = best.with_name(best.name + ".tmp"), best.with_name(best.name + ".old")
    if tmp.is_dir() and (tmp / "scores.json").is_file() and not best.exists():
        tmp.rename(best)
        logger.warning(
            "recovered %s from a complete %s left by an interrupted write", best, tmp.name
        )
    if old.is_dir() and not best.exists():
        old.rename(best)
        logger.warning(
            "restored the previous %s from %s (its replacement was interrupted)", best, old.name
        )
    for leftover in (tmp, old):
        if leftover.exists():
            shutil.rmtree(leftover, ignore_errors=True)
            logger.info("removed %s left by an interrupted write", leftover)


def save_best(model: Any, vocab: Any, plan: Any, out: Path, scores: dict[str, Any]) -> None:
    """Write the model folder and its score together, atomically: build it beside, then swap it
    in. ``scores.json`` is written last, so a folder without it is incomplete
    (:func:`recover_best` tells); a write that fails (a full disk: :class:`DiskFullError`
    naming the folder and the bytes its weights need) removes the half-built folder and
    leaves the previous best as it was. ``model`` is an :class:`~asrfit.recipes.asr_model.ASRModel`,
    ``vocab`` its text codec. The built-in Conformer's folder also gets the model's code
    (:func:`~asrfit.models.hub.write_remote_code`), so it loads without asrfit; another CTC
    model with the character vocabulary gets the tokenizer's (``write_tokenizer_code``), so
    the ASR pipeline decodes as asrfit does, and so does a Whisper trained on the characters
    (the encoder-decoder variant: no merging of repeats)."""
    tmp, old = out.with_name(out.name + ".tmp"), out.with_name(out.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_model_folder(model, vocab, plan, tmp)
        atomic_write_text(tmp / "scores.json", json.dumps(scores))
    except BaseException as exc:
        written = (
            sum(f.stat().st_size for f in tmp.rglob("*") if f.is_file()) if tmp.is_dir() else 0
        )
        shutil.rmtree(tmp, ignore_errors=True)  # the previous best stays as it was
        reason = disk_full_reason(exc)
        if reason is None:
            raise
        needed = sum(t.numel() * t.element_size() for t in model.model.state_dict().values())
        raise DiskFullError(str(out), needed, written, reason) from exc
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def _write_model_folder(model: Any, vocab: Any, plan: Any, folder: Path) -> None:
    """The files of :func:`save_best` but its score: weights (safetensors), configs, code, plan."""
    model.model.save_pretrained(folder, safe_serialization=True)
    vocab.save(folder)
    model.frontend.save(folder)
    card = None
    if model.family == "asrfit_conformer":  # its code too: loads without asrfit
        write_remote_code(folder)
        card = "asrfit_conformer"
    elif model.is_ctc and isinstance(vocab, CharVocabulary):
        write_tokenizer_code(folder)
        card = "ctc"
    elif model.family == "whisper" and isinstance(vocab, CharVocabulary):
        write_tokenizer_code(folder, seq2seq=True)  # decodes without CTC's merging
        card = "seq2seq"
    if card is not None:  # README.md: the code files, and how to load without running them
        write_model_card(folder, card)
    plan.save(folder / "plan.json")


def write_clean_manifest(utterances: Sequence[Any], path: Path) -> Path:
    """The utterances that passed validation (chunks as ``offset``/``duration`` spans), as the
    JSONL manifest the planner profiles."""
    rows = []
    for utt in utterances:
        row: dict[str, Any] = {
            "audio_filepath": str(Path(utt.source).resolve()),
            "text": utt.text,
            "duration": float(utt.duration_seconds),
        }
        if utt.offset_seconds:
            row["offset"] = float(utt.offset_seconds)
        rows.append(json.dumps(row, ensure_ascii=False))
    return atomic_write_text(path, "".join(r + "\n" for r in rows))


@dataclass
class RunState:
    """The epochs already scored (``run_state.json``, rewritten atomically after each).

    Attributes:
        epochs: The epoch records (as dicts), in order.
        scored: ``"stage:step"`` of every epoch end whose dev score (and best model) is saved.
    """

    epochs: list[dict[str, Any]] = field(default_factory=list)
    scored: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> RunState:
        """Read it (an empty state when there is none)."""
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(list(data["epochs"]), list(data["scored"]))

    def save(self, path: Path) -> None:
        """Write it atomically."""
        atomic_write_text(path, json.dumps({"epochs": self.epochs, "scored": self.scored}))

    def is_scored(self, stage: int, step: int) -> bool:
        """Whether the epoch ending at ``step`` of ``stage`` was scored."""
        return f"{stage}:{step}" in self.scored

    def add(self, stage: int, step: int, record: dict[str, Any]) -> None:
        """Record a scored epoch."""
        self.epochs.append(record)
        self.scored.append(f"{stage}:{step}")


__all__ = [
    "RunState",
    "long_audio_cap_seconds",
    "parse_save_every",
    "recover_best",
    "write_clean_manifest",
]
