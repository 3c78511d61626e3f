"""Write a speech corpus from three synthesizers: unseen voices, sentences and a held-out engine.

Four splits, each with its own sentences (from :class:`~asrfit.recipes.speech.grammar.Grammar`)
and its own voices (:func:`~asrfit.recipes.speech.voices.split_voices`):

* ``train``: espeak-ng's training variants and flite's voices, with speed, vocal-tract-length
  and channel perturbation, rooms and noise (:data:`TRAIN_POLICY`);
* ``dev`` and ``test``: espeak-ng variants never in train, flite's voices with other pitches and
  rates, sentences never in train, milder rooms and noise;
* ``heldout``: Festival, an engine no other split hears (diphone and HTS voices).

Each utterance draws from its own random stream ``(seed, split, index)``. espeak-ng keeps some
synthesis state from one call to the next that neither a re-initialisation nor its random seed
resets, so utterances are rendered in fixed shards of :data:`SHARD_SIZE`, each in a fresh
process: the corpus is byte-identical for a seed whatever the number of worker processes. An
utterance's samples still depend on the utterances before it in its shard, and shards run
across the splits in order, so another ``num_train`` also changes dev's and test's espeak-ng
renders (their sentences, voices and conditions stay).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from asrfit.errors import ConfigError
from asrfit.recipes.demo import (
    DemoCorpus,
    DemoSplit,
    check_counts_and_seed,
    prepare_corpus_folder,
)
from asrfit.recipes.speech import engines
from asrfit.recipes.speech.augment import (
    EVAL_POLICY,
    TRAIN_POLICY,
    AugmentPolicy,
    apply_conditions,
    draw_conditions,
    resample,
)
from asrfit.recipes.speech.grammar import Grammar
from asrfit.recipes.speech.voices import HELD_OUT_ENGINE, Speaker, pick_speaker, split_voices
from asrfit.utils.io import Pathlike, atomic_write_text

logger = logging.getLogger(__name__)

SPEECH_SPLITS = ("train", "dev", "test", "heldout")
LM_TEXT = "lm_text.txt"
#: Text-only sentences :func:`write_lm_text` adds to the training transcripts by default. On
#: the seed-0 corpus a 3-gram of 503,000 sentences cut dev CER of the same acoustic model from
#: 4.4 % (53,000) to 4.0 % (docs/benchmarks.md, "Speech demo: how the recipe was chosen").
LM_SENTENCES = 500_000
_SPLIT_IDS = {name: i for i, name in enumerate(SPEECH_SPLITS)}
SHARD_SIZE = 64


@dataclasses.dataclass(frozen=True)
class _Job:
    split: str
    index: int
    seed: int
    sentence_id: str
    text: str
    speakers: dict[str, list[Speaker]]
    policy: AugmentPolicy
    sample_rate: int
    path: str


def _render(job: _Job) -> dict[str, object]:
    """Render one utterance to ``job.path``; return its manifest line."""
    rng = np.random.default_rng([job.seed, _SPLIT_IDS[job.split], job.index])
    speaker = pick_speaker(rng, job.speakers)
    pitch = int(np.clip(speaker.pitch + rng.integers(-8, 9), 0, 100))
    rate = int(np.clip(speaker.rate_wpm + rng.integers(-15, 16), 100, 260))
    raw, raw_rate = engines.render(
        speaker.engine,
        speaker.voice,
        job.text,
        rate_wpm=rate,
        pitch=pitch,
        pitch_range=speaker.pitch_range,
        seed=int(rng.integers(2**31)),
    )
    cond = draw_conditions(rng, job.policy)
    audio = resample(raw, raw_rate, job.sample_rate, cond.speed)
    audio = apply_conditions(audio, cond, rng, job.sample_rate)
    lead, tail = (
        np.zeros(int(rng.uniform(0.05, 0.3) * job.sample_rate), np.float32) for _ in range(2)
    )
    audio = np.concatenate([lead, audio, tail])
    audio *= float(rng.uniform(0.3, 0.9)) / (float(np.max(np.abs(audio))) + 1e-9)
    sf.write(job.path, audio, job.sample_rate, subtype="PCM_16", format="WAV")
    rel = str(Path(job.path).relative_to(Path(job.path).parents[2]))
    return {
        "audio_filepath": rel,
        "duration": audio.size / job.sample_rate,
        "text": job.text,
        "speaker": speaker.speaker_id,
        "engine": speaker.engine,
        "voice": speaker.voice,
        "voice_family": speaker.family,
        "sentence_id": job.sentence_id,
        # what the voice was asked for; None where it speaks at its own rate or pitch
        "rate_wpm": None if speaker.voice in engines.OWN_RATE_VOICES else rate,
        "pitch": None if speaker.voice in engines.OWN_PITCH_VOICES else pitch,
        "source_rate": raw_rate,
        **dataclasses.asdict(cond),
    }


def _render_shard(jobs: list[_Job]) -> list[dict[str, object]]:
    """Render a shard of utterances in order (run in a fresh process)."""
    return [_render(job) for job in jobs]


def _check(counts: dict[str, int], seed: int, workers: int) -> None:
    check_counts_and_seed(counts, seed)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers={workers!r}: give a whole number of processes, at least 1.")


def write_speech_corpus(
    out_dir: Pathlike,
    *,
    num_train: int = 3000,
    num_dev: int = 200,
    num_test: int = 200,
    num_heldout: int = 200,
    seed: int = 0,
    sample_rate: int = 16000,
    workers: int = 1,
    overwrite: bool = False,
    lm_sentences: int = LM_SENTENCES,
) -> DemoCorpus:
    """Render a seeded corpus: ``{train,dev,test,heldout}.jsonl`` and WAVs under ``audio/``.

    Manifest lines hold ``audio_filepath`` (relative to the manifest), ``duration``, ``text``,
    ``speaker``, ``engine``, ``voice``, ``voice_family``, ``sentence_id``, the drawn rate and
    pitch, the engine's sample rate (``source_rate``) and the acoustic conditions
    (:class:`~asrfit.recipes.speech.augment.Conditions`). No sentence and no speaker is in two
    splits; dev and test's espeak-ng voices are variants never heard in training, and
    ``heldout`` speaks with an engine, Festival, that no other split hears.

    Args:
        out_dir: Folder to write into; created when missing, must be empty unless ``overwrite``.
        num_train, num_dev, num_test, num_heldout: Utterances per split.
        seed: Seeds the sentences, the voice split, the speakers and every draw.
        sample_rate: Samples per second of the WAVs. (Default: 16000)
        workers: Processes rendering in parallel; the output does not depend on it.
        overwrite: Replace an earlier corpus in ``out_dir``.
        lm_sentences: Text-only sentences written with the training transcripts to
            ``lm_text.txt`` for a language model (:func:`write_lm_text`; 0: no file).

    Returns:
        A :class:`~asrfit.recipes.demo.DemoCorpus` (its ``splits`` include ``heldout``).

    Raises:
        ConfigError: On a bad count, seed, worker count or a non-empty ``out_dir``.
        AsrfitError: When ``espeakng-loader``, flite or Festival is not installed.
    """
    counts = {"train": num_train, "dev": num_dev, "test": num_test, "heldout": num_heldout}
    _check(counts, seed, workers)
    engines.require(engines.ENGINES)  # fail early, with the install hint, before any writing
    voices = split_voices(seed)
    out = Path(out_dir)
    prepare_corpus_folder(out, overwrite, SPEECH_SPLITS, "speech corpus")
    started = time.perf_counter()
    sentences = Grammar().sentences(sum(counts.values()), seed)
    jobs: dict[str, list[_Job]] = {}
    first = 0
    for split in SPEECH_SPLITS:
        (out / "audio" / split).mkdir(parents=True, exist_ok=True)
        speakers = voices.speakers(split, seed)
        policy = TRAIN_POLICY if split == "train" else EVAL_POLICY
        jobs[split] = [
            _Job(
                split,
                i,
                seed,
                f"s{first + i:06d}",
                sentences[first + i],
                speakers,
                policy,
                sample_rate,
                str(out / "audio" / split / f"{i + 1:06d}.wav"),
            )
            for i in range(counts[split])
        ]
        first += counts[split]
    every = [job for split in SPEECH_SPLITS for job in jobs[split]]
    shards = [every[i : i + SHARD_SIZE] for i in range(0, len(every), SHARD_SIZE)]
    with multiprocessing.get_context("spawn").Pool(workers, maxtasksperchild=1) as pool:
        lines = [line for shard in pool.map(_render_shard, shards, chunksize=1) for line in shard]
    splits: dict[str, DemoSplit] = {}
    for split in SPEECH_SPLITS:
        mine = [line for line, job in zip(lines, every, strict=True) if job.split == split]
        path = atomic_write_text(
            out / f"{split}.jsonl", "".join(json.dumps(x) + "\n" for x in mine)
        )
        seconds = [float(x["duration"]) for x in mine]  # type: ignore[arg-type]
        splits[split] = DemoSplit(
            split, str(path), len(mine), sum(seconds), min(seconds), max(seconds)
        )
    if lm_sentences:
        write_lm_text(out, seed=seed, extra=lm_sentences)
    characters = "".join(sorted(set("".join(sentences)) | {" "}))
    name = f"espeak-ng + flite; held out: {HELD_OUT_ENGINE}"
    corpus = DemoCorpus(str(out), name, seed, sample_rate, characters, splits)
    logger.info(
        "wrote a speech corpus to %s in %.1f s: %s",
        out,
        time.perf_counter() - started,
        ", ".join(
            f"{s.name} {s.num_utterances} utt / {s.total_seconds / 60:.1f} min"
            for s in splits.values()
        ),
    )
    return corpus


def write_lm_text(corpus_dir: Pathlike, *, seed: int = 0, extra: int = LM_SENTENCES) -> Path:
    """Write ``lm_text.txt``: the training transcripts and ``extra`` text-only sentences.

    The text a language model may learn from, as a speech engineer's in-domain text corpus
    (LibriSpeech's LM text beside its audio): the grammar's next ``extra`` distinct sentences
    after the corpus's own, so no dev, test or held-out sentence is among them. One sentence per
    line. Works on a corpus written before this file existed.

    Raises:
        ConfigError: When ``extra`` is negative, a manifest is missing, or the manifests'
            sentences are not the grammar's for ``seed`` (another seed or grammar).
    """
    if isinstance(extra, bool) or not isinstance(extra, int) or extra < 0:
        raise ConfigError(f"extra={extra!r}: give a whole number of sentences, 0 or more.")
    out = Path(corpus_dir)
    texts: dict[str, list[str]] = {}
    for split in SPEECH_SPLITS:
        path = out / f"{split}.jsonl"
        if not path.is_file():
            raise ConfigError(
                f"{path}: missing; write the corpus with `asrfit demo-data --speech`."
            )
        with path.open(encoding="utf-8") as f:
            texts[split] = [json.loads(line)["text"] for line in f if line.strip()]
    ordered = [t for split in SPEECH_SPLITS for t in texts[split]]
    drawn = Grammar().sentences(len(ordered) + extra, seed) if ordered or extra else []
    if drawn[: len(ordered)] != ordered:
        raise ConfigError(
            f"{out}: its transcripts are not the grammar's sentences for seed {seed}; pass the "
            "seed the corpus was written with."
        )
    held_out = {t for split in SPEECH_SPLITS[1:] for t in texts[split]}
    lines = texts["train"] + [t for t in drawn[len(ordered) :] if t not in held_out]
    return atomic_write_text(out / LM_TEXT, "".join(t + "\n" for t in lines))
