"""``asrfit demo-data``: write the built-in demo corpus."""

from __future__ import annotations

import click

from asrfit.cli.options import POSITIVE_INT
from asrfit.cli.render import console, print_json, rows_table


@click.command("demo-data")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--num-train", type=POSITIVE_INT, default=None, help="[default: 600; 3000 with --speech]"
)
@click.option("--num-dev", type=POSITIVE_INT, default=None, help="[default: 60; 200 with --speech]")
@click.option(
    "--num-test", type=POSITIVE_INT, default=None, help="[default: 60; 200 with --speech]"
)
@click.option(
    "--num-heldout",
    type=POSITIVE_INT,
    default=200,
    show_default=True,
    help="With --speech: utterances of the held-out engine (Festival).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--espeak", is_flag=True, help="Render real synthetic speech with the espeak-ng program."
)
@click.option(
    "--speech",
    is_flag=True,
    help="Sentences spoken by espeak-ng's and flite's voices (pip install 'asrfit[speech]'; "
    "apt-get install flite festival festvox-kdlpc16k festvox-us-slt-hts), with perturbations, "
    "rooms, noise and channels; dev/test use unseen sentences and espeak-ng voices, 'heldout' "
    "an engine no other split hears (Festival).",
)
@click.option(
    "--workers",
    type=POSITIVE_INT,
    default=1,
    show_default=True,
    help="With --speech: rendering processes.",
)
@click.option(
    "--lm-sentences",
    type=click.IntRange(min=0),
    default=500_000,
    show_default=True,
    help="With --speech: text-only sentences (none in dev/test) written with the training "
    "transcripts to lm_text.txt, for an n-gram language model.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing corpus in OUT_DIR.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def command(
    out_dir: str,
    num_train: int | None,
    num_dev: int | None,
    num_test: int | None,
    num_heldout: int,
    seed: int,
    espeak: bool,
    speech: bool,
    workers: int,
    lm_sentences: int,
    overwrite: bool,
    as_json: bool,
) -> None:
    """Write a small, seeded, learnable speech corpus (JSONL manifests + WAV) to OUT_DIR."""
    if speech:
        from asrfit.recipes.speech.corpus import write_speech_corpus

        corpus = write_speech_corpus(
            out_dir,
            num_train=num_train or 3000,
            num_dev=num_dev or 200,
            num_test=num_test or 200,
            num_heldout=num_heldout,
            seed=seed,
            workers=workers,
            overwrite=overwrite,
            lm_sentences=lm_sentences,
        )
    else:
        from asrfit.recipes.demo import write_demo_corpus

        corpus = write_demo_corpus(
            out_dir,
            num_train=num_train or 600,
            num_dev=num_dev or 60,
            num_test=num_test or 60,
            seed=seed,
            speech="espeak" if espeak else "synthetic",
            overwrite=overwrite,
        )
    if as_json:
        print_json(dict(corpus.summary_rows()))
        return
    console.print(rows_table(f"Demo corpus in {out_dir}", corpus.summary_rows()))
