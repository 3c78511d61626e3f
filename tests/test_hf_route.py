"""The Hugging Face route of examples/hf_trainer_ctc.py, run for real: a datasets Dataset with
an audio column -> create_optimal_config -> TrainingArguments -> MemoryBudgetTrainer (with
AdaptiveMemoryCallback) -> train() -> evaluate()."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from asrfit.testing import dummy_hf_dataset
from asrfit.train.config import TrainingConfig
from tests.test_exports import example_plan

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "hf_trainer_ctc.py"


def load_example():
    spec = importlib.util.spec_from_file_location("hf_trainer_ctc", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_example_trains_and_evaluates_through_the_trainer(tmp_path, one_thread):
    metrics = load_example().main(str(tmp_path), utterances=12, max_steps=2)
    assert math.isfinite(metrics["train_loss"]) and math.isfinite(metrics["eval_loss"])
    assert (tmp_path / "memory" / "memory.jsonl").is_file()  # the callback ran


def test_to_training_arguments_recomputes_accumulation_and_keeps_columns(tmp_path):
    from transformers import TrainingArguments

    config = TrainingConfig.from_plan(example_plan(precision="fp32"))
    fixed = TrainingArguments(output_dir=str(tmp_path), **config.to_training_arguments())
    assert fixed.per_device_train_batch_size == 5
    assert fixed.gradient_accumulation_steps == 6  # round(32 / 5): the target with a fixed 5
    assert fixed.remove_unused_columns is False  # the collator needs the audio column
    sampled = TrainingArguments(
        output_dir=str(tmp_path), **config.to_training_arguments(memory_budget_sampler=True)
    )
    assert sampled.gradient_accumulation_steps == 2  # the plan's, for its bucketed batches


def test_audio_is_decoded_without_torchcodec(tmp_path):
    from asrfit.train.hf import decode_audio, prepare_audio_dataset

    ds = prepare_audio_dataset(dummy_hf_dataset(tmp_path, [0.5, 1.0], sample_rate_hz=8000))
    audio = decode_audio(ds[1]["audio"], 16000)
    assert audio.shape == (16000,)  # 1 s resampled from 8 kHz
    with pytest.raises(Exception, match="no audio column 'speech'"):
        prepare_audio_dataset(ds, "speech")


@pytest.mark.slow
@pytest.mark.parametrize("grouped", [False, True])
def test_the_plain_trainer_route_trains(tmp_path, one_thread, grouped):
    # README: TrainingArguments(output_dir=..., **config.to_training_arguments()) then
    # Trainer.train(), with a dataset of audio and text only (lengths added for grouping)
    from transformers import Trainer, TrainingArguments, Wav2Vec2FeatureExtractor

    from asrfit import create_optimal_config
    from asrfit.train.hf import SpeechCollator, add_length_column, prepare_audio_dataset

    example = load_example()
    ds = example.make_corpus(tmp_path / "train", 12, "audio")
    tokenizer = example.make_tokenizer(list(ds["text"]), tmp_path)
    model = example.tiny_model(len(tokenizer))
    config, _ = create_optimal_config(ds, model, gpu="T4", target_batch_size=4, precision="fp32")
    if grouped:
        ds = add_length_column(ds)
        assert ds["input_length"] == pytest.approx([d for d in example_durations(ds)], abs=1e-3)
    kwargs = config.to_training_arguments(length_column="input_length" if grouped else None)
    assert ("length_column_name" in kwargs) is grouped
    kwargs.update(
        optim="adamw_torch", max_steps=2, save_strategy="no", report_to="none", use_cpu=True
    )
    trainer = Trainer(
        model=model,
        args=TrainingArguments(output_dir=str(tmp_path / "out"), **kwargs),
        train_dataset=prepare_audio_dataset(ds),
        data_collator=SpeechCollator(
            Wav2Vec2FeatureExtractor(return_attention_mask=True), tokenizer
        ),
    )
    assert math.isfinite(trainer.train().training_loss)


def example_durations(ds) -> list[float]:
    """Each row's duration from its decoded audio (the reference for the header lengths)."""
    from asrfit.train.hf import decode_audio, prepare_audio_dataset

    return [len(decode_audio(cell, 16000)) / 16000 for cell in prepare_audio_dataset(ds)["audio"]]


def test_a_common_voice_sentence_column_is_found_by_the_loaders_and_the_collator(tmp_path):
    # create_optimal_config and the profile find the transcript among the usual names; the
    # utterance reader (MemoryBudgetTrainer's durations and label lengths) and the collator
    # insisted on "text" and raised a KeyError on Common Voice's "sentence"
    from transformers import Wav2Vec2FeatureExtractor

    from asrfit.data.dataset import utterances_from
    from asrfit.errors import ManifestError
    from asrfit.train.hf import SpeechCollator, prepare_audio_dataset

    example = load_example()
    ds = example.make_corpus(tmp_path / "train", 3, "audio")
    texts = list(ds["text"])
    ds = ds.rename_column("text", "sentence")
    assert [u.text for u in utterances_from(ds)] == texts
    with pytest.raises(ManifestError, match="no text column 'transcript'; columns are"):
        utterances_from(ds, text_column="transcript")
    tokenizer = example.make_tokenizer(texts, tmp_path)
    rows = list(prepare_audio_dataset(ds))
    batch = SpeechCollator(Wav2Vec2FeatureExtractor(return_attention_mask=True), tokenizer)(rows)
    want = tokenizer(texts, padding=True, return_tensors="pt")["input_ids"]
    assert batch["labels"].shape == want.shape
    assert (batch["labels"][batch["labels"] != -100] == want[want != tokenizer.pad_token_id]).all()
