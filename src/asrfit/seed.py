"""The seed documents' public API: a thin facade over profiles, planner and trainer config.

asrfit grew out of a notebook and a small trainer that used these names, kept here so that
their code keeps working::

    config, manager = create_optimal_config(dataset, model, model_name="xls-r-300m")
    args = TrainingArguments(output_dir="out", **config.to_training_arguments())

- :class:`TrainingConfig` (from :mod:`asrfit.train.config`): the training config of a plan.
- :class:`ASRConfigManager`: profile the hardware, dataset and model, plan, save and load.
- :func:`create_optimal_config`: all of it in one call.

Nothing in asrfit imports this module: it only calls the core (the planner decides).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from asrfit.errors import ConfigError, UnsupportedModelError
from asrfit.plan import search
from asrfit.plan.plan import Plan
from asrfit.profiles.dataset import DatasetProfile
from asrfit.profiles.hardware import DEFAULT_SAFETY_MARGIN, HardwareProfile
from asrfit.profiles.model import ModelProfile
from asrfit.train.config import TrainingConfig
from asrfit.utils.io import Pathlike
from asrfit.utils.serialization import JsonDataclass

logger = logging.getLogger(__name__)

_FEATURE_ENCODER_FAMILIES = ("wav2vec2", "hubert", "wavlm")


@dataclass
class SavedConfig(JsonDataclass):
    """What :meth:`ASRConfigManager.save_config` writes: the profiles, the plan and the config.

    Attributes:
        safety_margin: The manager's safety margin.
        gpu: The GPU name asked for, or None (detect).
        hardware: The hardware profile, if made.
        dataset: The dataset profile, if made.
        model: The model profile, if made.
        plan: The plan, if made.
        config: The training config, if made.
    """

    safety_margin: float = DEFAULT_SAFETY_MARGIN
    gpu: str | None = None
    hardware: HardwareProfile | None = None
    dataset: DatasetProfile | None = None
    model: ModelProfile | None = None
    plan: Plan | None = None
    config: TrainingConfig | None = None


class ASRConfigManager:
    """Profile hardware, dataset and model, plan, and keep the results (the seed's manager).

    Each step stores its result on the manager: ``hardware``, ``dataset``, ``model``,
    ``plan`` and ``config`` (None until made).

    Args:
        safety_margin: Share of GPU memory a plan may fill, 0.5 to 0.98. (Default: 0.85)
        gpu: None or "auto" to detect this machine's GPUs, a catalog name ("T4",
            "A100-80GB") to plan for a GPU you do not have, or a ``HardwareProfile``.
    """

    def __init__(
        self, safety_margin: float = DEFAULT_SAFETY_MARGIN, gpu: str | HardwareProfile | None = None
    ) -> None:
        self.safety_margin = safety_margin
        self.gpu = gpu
        self.hardware: HardwareProfile | None = None
        self.dataset: DatasetProfile | None = None
        self.model: ModelProfile | None = None
        self.plan: Plan | None = None
        self.config: TrainingConfig | None = None

    def profile_hardware(self) -> HardwareProfile:
        """Detect this machine (``gpu`` None or "auto") or take the named GPU from the catalog.

        Returns:
            The profile, also stored in ``self.hardware``.

        Raises:
            UnknownGPUError: When the GPU name is not in the catalog.
            ConfigError: On a bad safety margin.
        """
        if isinstance(self.gpu, HardwareProfile):
            self.hardware = self.gpu
        elif self.gpu is None:
            self.hardware = HardwareProfile.detect(safety_margin=self.safety_margin)
        else:
            self.hardware = HardwareProfile.resolve(self.gpu, safety_margin=self.safety_margin)
        return self.hardware

    def profile_dataset(
        self, dataset: Any, sample_size: int = 200, **kwargs: Any
    ) -> DatasetProfile:
        """Profile a dataset without decoding its audio.

        Args:
            dataset: A ``datasets.Dataset``, a JSONL manifest path, a folder of audio, a lhotse
                ``CutSet``, or a ``DatasetProfile`` (kept as it is).
            sample_size: Audio headers to read where durations are not recorded.
            **kwargs: Passed to the matching builder (e.g. ``audio_column``, ``text_column``
                for a Hugging Face dataset).

        Returns:
            The profile, also stored in ``self.dataset``.

        Raises:
            ManifestError: When the dataset is missing, empty or of an unknown kind.
        """
        if isinstance(dataset, DatasetProfile):
            self.dataset = dataset
        else:
            self.dataset = DatasetProfile.from_source(dataset, sample_size=sample_size, **kwargs)
        return self.dataset

    def profile_model(self, model: Any, model_name: str | None = None) -> ModelProfile:
        """Profile a model object or name.

        A module with a transformers ``config`` (e.g. a ``Wav2Vec2ForCTC`` instance) is
        profiled as it is, from its own config and ``requires_grad`` flags; ``model_name``
        then only names it. A module without one cannot be simulated, so with a
        ``model_name`` the name's bundled or Hub config stands in for it; without one the
        profile has no config and :meth:`create_plan` will ask for a name.

        Args:
            model: An ``nn.Module``, a model name or path, a transformers config or config
                dict, or a ``ModelProfile`` (kept as it is).
            model_name: A bundled name, Hub id or folder ("xls-r-300m").

        Returns:
            The profile, also stored in ``self.model``.

        Raises:
            UnknownModelError: When a name resolves to no config.
            UnsupportedModelError: When ``model`` is none of the types above.
        """
        from torch import nn
        from transformers import PretrainedConfig

        if isinstance(model, nn.Module):
            if isinstance(getattr(model, "config", None), PretrainedConfig):
                profile = ModelProfile.from_module(model, name=model_name)
            elif model_name is not None:
                logger.info(
                    "%s has no transformers config; planning with the config of %r.",
                    type(model).__name__,
                    model_name,
                )
                profile = ModelProfile.from_pretrained(model_name)
            else:
                profile = ModelProfile.from_module(model)
        elif isinstance(model, (PretrainedConfig, dict)):
            profile = ModelProfile.from_config(model, name=model_name)
        else:
            profile = ModelProfile.from_spec(model)
        self.model = profile
        return profile

    def create_plan(self, target_batch_size: int = 32, **plan_kwargs: Any) -> Plan:
        """Plan with :func:`asrfit.plan.search.plan` and convert the plan to a config.

        Profiles the hardware first when :meth:`profile_hardware` has not run. For the
        wav2vec2 family the planner is told whether the profiled model's feature encoder is
        frozen, unless ``freeze_feature_encoder`` is given.

        Args:
            target_batch_size: Utterances per optimizer step over all GPUs.
            **plan_kwargs: Passed to the planner (``target_hours``, ``precision``,
                ``world_size``, ``long_utterances``, ``max_seconds``, ...).

        Returns:
            The plan, also stored in ``self.plan``; ``self.config`` holds its
            :class:`TrainingConfig`.

        Raises:
            ConfigError: When the dataset or model has not been profiled.
            UnsupportedModelError: When the model profile has no config to simulate.
        """
        if self.dataset is None:
            raise ConfigError(
                "ASRConfigManager: call profile_dataset(dataset) before create_plan()."
            )
        if self.model is None:
            raise ConfigError("ASRConfigManager: call profile_model(model) before create_plan().")
        if not self.model.config:
            raise UnsupportedModelError(
                f"model {self.model.name!r} ({self.model.model_class}) has no transformers config, "
                "so its step cannot be simulated; pass model_name= with a bundled name or Hub id "
                "of the same architecture (e.g. 'xls-r-300m')."
            )
        hardware = self.hardware if self.hardware is not None else self.profile_hardware()
        if self.model.family in _FEATURE_ENCODER_FAMILIES:
            # Plan the feature encoder as the profiled model has it (a module as it was passed).
            plan_kwargs.setdefault("freeze_feature_encoder", self.model.feature_encoder_frozen)
        self.plan = search.plan(
            hardware,
            self.dataset,
            self.model,
            target_effective_batch=target_batch_size,
            **plan_kwargs,
        )
        self.config = TrainingConfig.from_plan(self.plan)
        return self.plan

    def save_config(self, path: Pathlike) -> None:
        """Write the profiles, the plan and the config as one JSON file (atomically).

        Args:
            path: Destination, e.g. ``"asrfit_config.json"``.
        """
        SavedConfig(
            safety_margin=self.safety_margin,
            gpu=self.gpu if isinstance(self.gpu, str) else None,
            hardware=self.hardware,
            dataset=self.dataset,
            model=self.model,
            plan=self.plan,
            config=self.config,
        ).save(path)

    def load_config(self, path: Pathlike) -> TrainingConfig | None:
        """Load a file written by :meth:`save_config` into this manager.

        Args:
            path: The file.

        Returns:
            The training config (None when it was saved before planning).

        Raises:
            ConfigError: When the file is missing, not JSON, has an unknown or missing key
                (named), or a value fails validation.
        """
        saved = SavedConfig.load(path)
        self.safety_margin = saved.safety_margin
        self.gpu = saved.gpu
        self.hardware = saved.hardware
        self.dataset = saved.dataset
        self.model = saved.model
        self.plan = saved.plan
        self.config = saved.config
        return self.config


def create_optimal_config(
    dataset: Any,
    model: Any,
    model_name: str | None = None,
    target_batch_size: int = 32,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    gpu: str | HardwareProfile | None = None,
    audio_column: str = "audio",
    text_column: str | None = None,
    **plan_kwargs: Any,
) -> tuple[TrainingConfig, ASRConfigManager]:
    """Profile, plan and convert in one call (the seed's entry point).

    Args:
        dataset: A ``datasets.Dataset``, manifest path, audio folder or lhotse ``CutSet``.
        model: An ``nn.Module`` (e.g. a ``Wav2Vec2ForCTC``), a model name, or a config.
        model_name: Bundled name or Hub id; needed for a module without a transformers config.
        target_batch_size: Utterances per optimizer step over all GPUs. (Default: 32)
        safety_margin: Share of GPU memory a plan may fill. (Default: 0.85)
        gpu: None to detect, or a GPU name such as "T4" to plan for it.
        audio_column: The audio column of a ``datasets.Dataset``. (Default: "audio")
        text_column: The transcript column of a ``datasets.Dataset``. (Default: found among
            the usual names, as :meth:`DatasetProfile.from_hf_dataset` does: ``text``,
            ``sentence`` (Common Voice), ``transcription``...)
        **plan_kwargs: Passed to the planner (see :meth:`ASRConfigManager.create_plan`).

    Returns:
        The training config and the manager holding the profiles and the plan. Train with
        ``TrainingArguments(output_dir=..., **config.to_training_arguments())`` and a plain
        ``Trainer``, or with ``to_training_arguments(memory_budget_sampler=True)`` and
        :class:`asrfit.train.hf.MemoryBudgetTrainer` (``plan=manager.plan``); see
        ``examples/hf_trainer_ctc.py``.
    """
    manager = ASRConfigManager(safety_margin=safety_margin, gpu=gpu)
    manager.profile_hardware()
    columns = {}
    if hasattr(dataset, "column_names"):  # a datasets.Dataset: its columns are named
        columns = {"audio_column": audio_column, "text_column": text_column}
    manager.profile_dataset(dataset, **columns)
    manager.profile_model(model, model_name=model_name)
    manager.create_plan(target_batch_size=target_batch_size, **plan_kwargs)
    assert manager.config is not None  # set by create_plan
    return manager.config, manager


__all__ = ["ASRConfigManager", "SavedConfig", "TrainingConfig", "create_optimal_config"]
