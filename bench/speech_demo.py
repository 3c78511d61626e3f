"""Score a `make demo-speech` run: the acoustic model alone (greedy CTC) on dev, test and the
held-out engine, then beam search with word n-grams reported apart; writes a section of
docs/benchmarks.md and ``decoding.json`` in the run folder.

The headline is greedy decoding: what the acoustic model reads with no language model. Two
n-grams are scored apart: one of the training transcripts only, and (where the corpus has
``lm_text.txt``) one of the transcripts plus text-only grammar sentences that are in no dev,
test or held-out utterance. Each one's weight (alpha) and word bonus (beta) are chosen on dev,
then applied once to test and to the held-out engine. Beside each n-gram stands its overlap with
each split: the share of the split's word n-grams the LM text holds.

While a recipe is tuned, score dev alone (``--splits dev``, no ``--out``): test and the held-out
engine are then neither decoded nor printed.

Usage: python -m bench speech_demo --run runs/demo-speech --data demo-speech --out docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import platform
import time
from collections import Counter
from pathlib import Path

import torch

from asrfit.data.dataset import SpeechDataset, utterances_from
from asrfit.data.text import CharVocabulary
from asrfit.recipes.asr_model import build_asr_model
from asrfit.recipes.evaluate import error_rates
from asrfit.recipes.speech.beam import BeamDecoder, ctc_log_probs, greedy_texts
from asrfit.recipes.speech.corpus import LM_TEXT
from asrfit.recipes.speech.ngram import NgramModel
from bench._report import write_section

# The grid the n-gram weight and word bonus are chosen from on dev (widened wherever a choice
# sat on its edge: docs/history.md). Test and the held-out engine are decoded once, with the
# dev choice.
ALPHAS = (0.2, 0.3, 0.5, 0.8, 1.2)
BETAS = (2.0, 3.0, 5.0, 8.0, 12.0)


SPLITS = ("dev", "test", "heldout")


def _score(refs: list[str], hyps: list[str]) -> dict[str, float]:
    wer, cer = error_rates(refs, hyps)
    return {"wer": wer, "cer": cer}


def ngram_coverage(
    lm_lines: list[str], texts: dict[str, list[str]], order: int
) -> dict[str, dict[int, float]]:
    """For each split's ``texts``: the share of its word n-grams (n = 1 ... ``order``, within
    sentences) that occur in ``lm_lines``, how much of its word sequences the LM has seen."""
    wanted = {
        split: {
            n: [tuple(w[i : i + n]) for w in (t.split() for t in ts) for i in range(len(w) - n + 1)]
            for n in range(1, order + 1)
        }
        for split, ts in texts.items()
    }
    pending = {n: {g for by_n in wanted.values() for g in by_n[n]} for n in range(1, order + 1)}
    seen: set[tuple[str, ...]] = set()
    for line in lm_lines:
        words = line.split()
        for n, grams in pending.items():
            for i in range(len(words) - n + 1):
                gram = tuple(words[i : i + n])
                if gram in grams:
                    seen.add(gram)
    return {
        split: {n: sum(g in seen for g in gs) / len(gs) if gs else 0.0 for n, gs in by_n.items()}
        for split, by_n in wanted.items()
    }


def _manifest_rows(path: Path) -> list[dict]:
    """The JSON lines of a manifest (with the fields ``utterances_from`` drops: engine, voice)."""
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x]


def _by_engine(refs: list[str], hyps: list[str], engine_of: dict[str, str]) -> dict[str, dict]:
    """Greedy WER and CER per synthesizer (utterances matched to their manifest line by text)."""
    groups: dict[str, tuple[list[str], list[str]]] = {}
    for ref, hyp in zip(refs, hyps, strict=True):
        mine = groups.setdefault(engine_of.get(ref, "unknown"), ([], []))
        mine[0].append(ref)
        mine[1].append(hyp)
    return {e: {"utterances": len(r), **_score(r, h)} for e, (r, h) in sorted(groups.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default="runs/demo-speech")
    parser.add_argument("--data", default="demo-speech")
    parser.add_argument("--out", default=None, help="docs/benchmarks.md to write a section of")
    parser.add_argument(
        "--command", default="make demo-speech", help="the command shown beside the figures"
    )
    parser.add_argument("--beam-width", type=int, default=32)
    parser.add_argument("--order", type=int, default=3, help="n-gram order")
    parser.add_argument(
        "--splits", default=",".join(SPLITS), help="comma-separated; 'dev' alone while tuning"
    )
    args = parser.parse_args()
    splits = [x for x in SPLITS if x in args.splits.split(",")]
    if args.out and splits != list(SPLITS):
        parser.error("--out writes the whole section: score every split (drop --splits).")
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    run, data = Path(args.run), Path(args.data)
    report = json.loads((run / "report.json").read_text(encoding="utf-8"))
    vocab = CharVocabulary.load(run / "best")
    asr = build_asr_model(str(run / "best"), vocab, pretrained=True)
    train_texts = [u.text for u in utterances_from(str(data / "train.jsonl"))]
    lm_sources = {"transcripts": train_texts}
    if (data / LM_TEXT).is_file():  # written by `asrfit demo-data --speech` (write_lm_text)
        lm_sources["text"] = (data / LM_TEXT).read_text(encoding="utf-8").splitlines()

    def log_probs(split: str) -> tuple[list[str], list]:
        ds = SpeechDataset(
            utterances_from(str(data / f"{split}.jsonl")),
            vocab,
            asr.frontend,
            **asr.label_rules(scoring=True),
            long_utterances="chunk",
            cache=False,
            keep_unknown=True,
        )
        return ds.texts, ctc_log_probs(asr.model, ds, asr.output_frames)

    started = time.perf_counter()
    dev_refs, dev_lp = log_probs("dev")
    has_kenlm = importlib.util.find_spec("kenlm") is not None
    lms = {
        name: _tuned_lm(name, texts, vocab, run, args, dev_refs, dev_lp, has_kenlm)
        for name, texts in lm_sources.items()
    }
    no_lm = BeamDecoder(vocab, beam_width=args.beam_width)
    results: dict[str, dict] = {}
    refs_of: dict[str, list[str]] = {}
    for split in splits:
        refs, lp = (dev_refs, dev_lp) if split == "dev" else log_probs(split)
        rows = _manifest_rows(data / f"{split}.jsonl")
        refs_of[split] = refs
        engine_of = {r["text"]: r.get("engine", "espeak-ng") for r in rows}
        words = [w for r in refs for w in r.split()]
        t0 = time.perf_counter()
        greedy = greedy_texts(lp, vocab)
        t1 = time.perf_counter()
        beams = {name: lm["decoder"].decode(lp) for name, lm in lms.items()}
        t2 = time.perf_counter()
        results[split] = {
            "utterances": len(refs),
            "minutes": sum(r["duration"] for r in rows) / 60,
            "voices": sorted({r.get("voice", r["speaker"]) for r in rows}),
            "greedy_by_engine": _by_engine(refs, greedy, engine_of),
            "oov_rate": {
                name: sum(w not in lm["lexicon"] for w in words) / len(words)
                for name, lm in lms.items()
            },
            "greedy": _score(refs, greedy),
            "beam_no_lm": _score(refs, no_lm.decode(lp)),
            **{f"beam_lm_{name}": _score(refs, beam) for name, beam in beams.items()},
            "greedy_seconds": t1 - t0,
            "beam_lm_seconds": (t2 - t1) / len(beams),
            "examples": [
                [r, g, b]
                for r, g, b in list(zip(refs, greedy, beams["transcripts"], strict=True))[:3]
            ],
        }
    for name in lms:
        coverage = ngram_coverage(lm_sources[name], refs_of, args.order)
        for split, r in results.items():
            r.setdefault("lm_ngram_coverage", {})[name] = coverage[split]
    train_rows = _manifest_rows(data / "train.jsonl")
    out = {
        "train": {
            "utterances": len(train_rows),
            "minutes": sum(r["duration"] for r in train_rows) / 60,
            "by_engine": dict(Counter(r.get("engine", "espeak-ng") for r in train_rows)),
        },
        "kenlm": has_kenlm,
        "beam_width": args.beam_width,
        "order": args.order,
        "lms": {
            name: {k: v for k, v in lm.items() if k not in ("decoder", "lexicon")}
            for name, lm in lms.items()
        },
        "splits": results,
        "wall_seconds": time.perf_counter() - started,
    }
    (run / "decoding.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    (run / "dev_cer.svg").write_text(dev_cer_svg(report), encoding="utf-8")
    print(
        json.dumps(
            {
                k: {m: v for m, v in results[k].items() if m.startswith(("greedy", "beam"))}
                for k in results
            },
            indent=1,
        )
    )
    if args.out:
        scoring = (
            f"python -m bench speech_demo --run {args.run} --data {args.data} --out {args.out}"
        )
        write_section(Path(args.out), "speech-demo", _markdown(report, out, args.command, scoring))


def _tuned_lm(
    name: str,
    texts: list[str],
    vocab: CharVocabulary,
    run: Path,
    args: argparse.Namespace,
    dev_refs: list[str],
    dev_lp: list,
    has_kenlm: bool,
) -> dict:
    """An n-gram of ``texts``, its weight and word bonus chosen on dev, and its decoder."""
    lm = NgramModel(texts, order=args.order)
    arpa = lm.save_arpa(run / f"lm_{name}.arpa")
    tuning = {}
    for alpha, beta in itertools.product(ALPHAS, BETAS) if has_kenlm else [(0.0, 0.0)]:
        if not has_kenlm:  # beam search without a language model: the figures say so
            tuning[(alpha, beta)] = {"cer": 0.0}
            break
        decoder = BeamDecoder(
            vocab, arpa, unigrams=lm.words, alpha=alpha, beta=beta, beam_width=args.beam_width
        )
        tuning[(alpha, beta)] = _score(dev_refs, decoder.decode(dev_lp))
    alpha, beta = min(tuning, key=lambda k: tuning[k]["cer"])
    decoder = BeamDecoder(
        vocab,
        arpa if has_kenlm else None,
        unigrams=lm.words if has_kenlm else None,
        alpha=alpha,
        beta=beta,
        beam_width=args.beam_width,
    )
    return {
        "decoder": decoder,
        "lexicon": set(lm.words),
        "sentences": len(texts),
        "alpha": alpha,
        "beta": beta,
        "dev_cer_by_alpha_beta": {f"{a},{b}": r["cer"] for (a, b), r in tuning.items()},
        "lm_words": len(lm.words),
        "lm_ngrams": len(lm.prob),
    }


def dev_cer_svg(report: dict, width: int = 360, height: int = 200) -> str:
    """A line plot of dev CER (%) per epoch, as a small standalone SVG."""
    points = [
        (i + 1, 100 * e["dev"]["cer"]) for i, e in enumerate(report["epochs"]) if e.get("dev")
    ]
    if not points:
        return ""
    top = max(10.0, max(c for _, c in points))
    x = lambda n: 40 + (width - 60) * (n - 1) / max(1, len(points) - 1)  # noqa: E731
    y = lambda c: height - 30 - (height - 50) * c / top  # noqa: E731
    path = " ".join(
        f"{'M' if i == 0 else 'L'}{x(n):.1f},{y(c):.1f}" for i, (n, c) in enumerate(points)
    )
    marks = "".join(
        f'<circle cx="{x(n):.1f}" cy="{y(c):.1f}" r="3"/><text x="{x(n):.1f}" y="{y(c) - 6:.1f}" '
        f'font-size="10" text-anchor="middle">{c:.1f}</text>'
        for n, c in points
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif">'
        f'<text x="{width / 2}" y="14" font-size="12" text-anchor="middle">dev CER (%) per epoch</text>'
        f'<line x1="40" y1="{height - 30}" x2="{width - 20}" y2="{height - 30}" stroke="black"/>'
        f'<line x1="40" y1="20" x2="40" y2="{height - 30}" stroke="black"/>'
        f'<text x="{width / 2}" y="{height - 8}" font-size="11" text-anchor="middle">epoch 1-{len(points)}</text>'
        f'<path d="{path}" fill="none" stroke="steelblue" stroke-width="2"/>{marks}</svg>\n'
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


SPLIT_NAMES = {
    "dev": "dev (unseen sentences and espeak-ng voices; best epoch and LM weights chosen on it)",
    "test": "**test** (unseen sentences and espeak-ng voices; flite's voices at other pitches and rates)",
    "heldout": "**held-out engine** (Festival, heard in no other split)",
}
ENGINE_ORDER = ("espeak-ng", "flite", "festival")


def _markdown(report: dict, dec: dict, command: str, scoring: str) -> str:
    cfg = report["config"]
    n = dec.get("order", 3)
    train_s = sum(e["wall_seconds"] for e in report["epochs"])
    train = dec["train"]
    mix = ", ".join(f"{e} {c:,}" for e, c in sorted(train["by_engine"].items()))
    lines = [
        "## Speech demo: Conformer-CTC on espeak-ng and flite speech, Festival held out (CPU)",
        "",
        f"Command: `{command}` (corpus: `asrfit demo-data --speech`; scoring: `{scoring}`).",
        f"Run: {time.strftime('%Y-%m-%d')}, {platform.machine()} {platform.system()}, nproc={os.cpu_count()}, "
        f"torch {torch.__version__}, device {report['device']}.",
        "",
        f"Training corpus: {train['utterances']:,} utterances, {train['minutes']:.1f} min ({mix}). "
        f"Model {cfg['model']} ({report['parameters'] / 1e6:.2f} M parameters, random init), "
        f"lr {cfg['learning_rate'] or 'default (1e-3)'}, {cfg['epochs']} epochs, target batch {cfg['target_batch']}, "
        f"SpecAugment {'on' if cfg['spec_augment'] else 'off'}, overrides {cfg['model_overrides'] or 'none'}; "
        f"training wall time {train_s / 60:.1f} min (whole `asrfit train` {report['wall_seconds'] / 60:.1f} min).",
        "",
        "| epoch | steps | train loss | dev WER | dev CER | epoch wall s |",
        "|---|---|---|---|---|---|",
    ]
    for e in report["epochs"]:
        dev = e.get("dev") or {}
        lines.append(
            f"| {e['epoch']} | {e['steps']} | {e['train_loss']:.3f} | "
            f"{_pct(dev['wer']) if dev else '-'} | {_pct(dev['cer']) if dev else '-'} | {e['wall_seconds']:.0f} |"
        )
    lines += [
        "",
        "The acoustic model alone (greedy CTC decoding, no language model) on the best-dev model; "
        "this run computed each test and held-out figure once:",
        "",
        "| split | utterances | minutes | greedy CER | greedy WER | "
        + " | ".join(f"{e} CER (utterances)" for e in ENGINE_ORDER)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(ENGINE_ORDER),
    ]
    for split, r in dec["splits"].items():
        by = r["greedy_by_engine"]
        cells = [
            f"{_pct(by[e]['cer'])} ({by[e]['utterances']})" if e in by else "-"
            for e in ENGINE_ORDER
        ]
        lines.append(
            f"| {SPLIT_NAMES[split]} | {r['utterances']} | {r['minutes']:.1f} | {_pct(r['greedy']['cer'])} | "
            f"{_pct(r['greedy']['wer'])} | " + " | ".join(cells) + " |"
        )
    voices = dec["splits"]["heldout"]["voices"]
    lines += ["", f"Held-out engine voices: {', '.join(voices)}."]
    if not dec["kenlm"]:
        lines += [
            "",
            "kenlm is not installed: the 'beam + n-gram' columns ran WITHOUT the language model.",
        ]
    lms = dec["lms"]
    about = {
        "transcripts": "the training transcripts",
        "text": "the training transcripts and text-only sentences of the same grammar as every "
        "split, none of them a dev, test or held-out sentence (`lm_text.txt`)",
    }
    lines += [
        "",
        f"With a word {n}-gram (beam width {dec['beam_width']}), reported apart: the n-grams know the "
        "grammar the test sentences come from. Overlap: the share of a split's word n-grams "
        "(within sentences) that occur in the LM's text.",
        "",
    ]
    for name, lm in lms.items():
        cover = ", ".join(
            f"{split} " + " / ".join(f"{_pct(v)}" for v in r["lm_ngram_coverage"][name].values())
            for split, r in dec["splits"].items()
        )
        lines.append(
            f"- {n}-gram **{name}**: {about[name]}; {lm['sentences']:,} sentences, "
            f"{lm['lm_words']:,} words, alpha {lm['alpha']} and beta {lm['beta']} chosen on dev "
            f"(best of {len(lm['dev_cer_by_alpha_beta'])} on the grid); overlap (1- / 2- / ... "
            f"{n}-grams): {cover}."
        )
    head = "| split, with an n-gram | beam, no LM CER |"
    rule = "|---|---|"
    for name in lms:
        head += f" words outside {name} LM | + {n}-gram {name} WER | + {n}-gram {name} CER |"
        rule += "---|---|---|"
    lines += ["", head, rule]
    for split, r in dec["splits"].items():
        row = f"| {SPLIT_NAMES[split]} | {_pct(r['beam_no_lm']['cer'])} |"
        for name in lms:
            beam = r[f"beam_lm_{name}"]
            row += f" {_pct(r['oov_rate'][name])} | {_pct(beam['wer'])} | {_pct(beam['cer'])} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
