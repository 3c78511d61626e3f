"""Checks a run makes of what it is given, and the one thing it sends away.

A run folder resumed with another model, a ``--plan`` made for another model, GPU or
dataset (refused unless ``--force-plan``), and ``--push-to-hub`` of the best model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from asrfit.errors import ConfigError
from asrfit.recipes.asr_model import ASRModel
from asrfit.recipes.run_report import RunConfig

logger = logging.getLogger(__name__)


def check_resumed_model(cfg: RunConfig, out: Path) -> None:
    """Refuse to resume a run folder with another model than it was trained with."""
    path = out / "run_config.json"
    if not path.is_file():
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # unreadable: the checkpoint itself will say whether it fits
    for name, flag in (("model", "--model"), ("model_overrides", "--set")):
        before, now = saved.get(name), json.loads(json.dumps(getattr(cfg, name)))  # as saved
        if name == "model_overrides":
            before, now = before or {}, now or {}
        if before != now:
            raise ConfigError(
                f"{out}: its run was trained with {flag} {before!r}, this one asks for {now!r}; "
                f"resume with the same {flag}, or train afresh in another --out folder."
            )


def check_loaded_plan(cfg: RunConfig, asr: ASRModel, dataset: Any, plan: Any) -> None:
    """Refuse a --plan made for another model, GPU or dataset, unless --force-plan (then log).

    ``dataset`` is the ``DatasetProfile`` the run would plan on (after validation)."""
    from asrfit.memory.report import resolve_adapter
    from asrfit.plan.fingerprint import (
        check_fingerprints,
        data_fingerprint,
        fingerprint_mismatches,
        fingerprints,
    )
    from asrfit.profiles.dataset import DatasetProfile
    from asrfit.profiles.hardware import HardwareProfile

    _, profile = resolve_adapter(asr.config)
    current = fingerprints(HardwareProfile.resolve(cfg.gpu), dataset, profile)
    saved = plan.fingerprints
    if "data" in saved and fingerprint_mismatches(
        {"data": saved["data"]}, {"data": current["data"]}
    ):
        # `asrfit plan` profiles the manifest as given; a run plans on it after validation and
        # chunking (train.clean.jsonl): either is the data the plan was made for
        raw = {"data": data_fingerprint(DatasetProfile.from_source(cfg.train))}
        if not fingerprint_mismatches({"data": saved["data"]}, raw):
            current["data"] = raw["data"]
    for line in check_fingerprints(saved, current, where=str(cfg.plan), force=cfg.force_plan):
        logger.warning("--force-plan: %s", line)


def push_to_hub(folder: Path, repo_id: str) -> None:
    """Upload the best model folder with huggingface_hub (needs a configured token)."""
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise ConfigError(
            "--push-to-hub needs a Hugging Face token: run `hf auth login` or set HF_TOKEN."
        )
    api = HfApi()
    api.create_repo(repo_id, exist_ok=True)
    api.upload_folder(folder_path=str(folder), repo_id=repo_id)
    logger.info("pushed %s to https://huggingface.co/%s", folder, repo_id)
