"""Whisper and Parakeet-TDT train end to end with a character vocabulary.

Tiny configs (random weights) of the bundled ``whisper-tiny`` and ``parakeet-tdt-0.6b-v2``,
trained by :class:`~asrfit.train.trainer.MemoryEfficientTrainer` with each family's
``loss_fn`` on a tiny synthetic corpus. References are independent of the code under test:
the gradient of one big batch for accumulation, a decoder re-run over the whole prefix for
Whisper's cached greedy search, each utterance decoded alone for the batched TDT search, and
label counts taken from the transcripts for the skips.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from asrfit.data.dataset import SpeechDataset, Utterance, utterances_from
from asrfit.data.text import CharVocabulary
from asrfit.errors import ConfigError
from asrfit.models.decoding import transducer_greedy, whisper_greedy
from asrfit.recipes.asr_model import ASRModel, auto_class_for, build_asr_model
from asrfit.recipes.demo import write_demo_corpus
from asrfit.recipes.evaluate import transcribe
from asrfit.train.batching import pad_collate
from asrfit.train.config import TrainingConfig
from asrfit.train.trainer import MemoryEfficientTrainer

SPECS = {"whisper": "whisper-tiny", "parakeet_tdt": "parakeet-tdt-0.6b-v2"}
TINY = {
    # 150 encoder positions: every sample is padded to a 300-frame (3 s) window
    "whisper": dict(
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=150,
        max_target_positions=64,
    ),
    # encoder fields go to encoder_config; dropout off so that gradients are deterministic
    "parakeet_tdt": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        subsampling_conv_channels=32,
        decoder_hidden_size=64,
        num_decoder_layers=1,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
    ),
}
FAMILIES = sorted(SPECS)
STEPS = 40
LEARNING_RATE = {"whisper": 3e-3, "parakeet_tdt": 1e-2}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    write_demo_corpus(out, num_train=8, num_dev=4, num_test=2, max_seconds=2.5, seed=1)
    return out


@pytest.fixture(scope="module")
def vocab(corpus) -> CharVocabulary:
    return CharVocabulary.build(u.text for u in utterances_from(corpus / "train.jsonl"))


def _build(family: str, vocab: CharVocabulary, seed: int = 0, **overrides) -> ASRModel:
    torch.manual_seed(seed)
    return build_asr_model(
        SPECS[family], vocab, pretrained=False, overrides={**TINY[family], **overrides}
    )


def _dataset(asr: ASRModel, source, vocab: CharVocabulary) -> SpeechDataset:
    return SpeechDataset(
        utterances_from(source), vocab, asr.frontend, **asr.label_rules(), cache=True
    )


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it steps on."""

    def step(self, closure=None):
        self.seen_grads = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]
        return super().step(closure)


def _trainer(asr: ASRModel, config: TrainingConfig, optimizer=None) -> MemoryEfficientTrainer:
    return MemoryEfficientTrainer(
        asr.model,
        config,
        loss_fn=asr.loss_fn,
        units_fn=asr.units_fn,
        optimizer=optimizer,
        progress=False,
        preflight=False,
        cpu=True,
    )


@pytest.fixture(scope="module", params=FAMILIES)
def trained(request, corpus, vocab):
    """A tiny model of each family after STEPS optimizer steps on 8 utterances (2 batches of 4)."""
    asr = _build(request.param, vocab)
    train = _dataset(asr, corpus / "train.jsonl", vocab)
    config = TrainingConfig(
        learning_rate=LEARNING_RATE[request.param], warmup_steps=0, num_train_epochs=math.inf
    )
    trainer = _trainer(asr, config)
    trainer.train([[0, 1, 2, 3], [4, 5, 6, 7]], dataset=train, max_steps=STEPS)
    asr.model.eval()
    return asr, trainer.history


# ------------------------------------------------------------------ model and labels


def test_special_ids_stay_clear_of_the_characters(vocab) -> None:
    n = len(vocab)  # <pad>, <unk>, |, then the characters: ids 0 .. n - 1
    whisper = _build("whisper", vocab).config
    assert (whisper.vocab_size, whisper.eos_token_id, whisper.decoder_start_token_id) == (
        n + 2,
        n,
        n + 1,
    )
    assert whisper.pad_token_id == 0 and whisper.begin_suppress_tokens is None
    tdt = _build("parakeet_tdt", vocab).config
    assert (tdt.vocab_size, tdt.blank_token_id, tdt.pad_token_id) == (
        n + 1,
        n,
        0,
    )  # blank is the last id
    assert tdt.encoder_config.hidden_size == 64 and tdt.encoder_config.num_key_value_heads == 4


def test_whisper_samples_fill_the_encoder_window_and_end_with_eos(corpus, vocab) -> None:
    asr = _build("whisper", vocab)
    data = _dataset(asr, corpus / "train.jsonl", vocab)
    sample = data[0]
    assert tuple(sample["input_features"].shape) == (80, 2 * 150)  # 2 x max_source_positions
    assert asr.frontend.max_seconds == 3.0
    ids, _ = vocab.encode(data.utterances[0].text)
    assert sample["labels"].tolist() == [*ids, asr.config.eos_token_id]
    # the model takes the batch as it is: decoder inputs are the labels shifted behind the start token
    out = asr.model(**pad_collate([data[0], data[1]]))
    assert out.logits.shape[-1] == len(vocab) + 2 and torch.isfinite(out.loss)


def test_whisper_skips_labels_beyond_max_target_positions(corpus, vocab) -> None:
    asr = _build("whisper", vocab, max_target_positions=20)
    utts = utterances_from(corpus / "train.jsonl")
    too_long = sum(len(vocab.encode(u.text)[0]) + 1 > 20 for u in utts)  # + end of text
    assert 0 < too_long < len(utts)
    data = SpeechDataset(utts, vocab, asr.frontend, **asr.label_rules())
    assert dict(data.skipped) == {"too_long_for_decoder": too_long}
    assert len(data) == len(utts) - too_long and max(data.label_lengths) <= 20


def test_tdt_keeps_transcripts_longer_than_its_frames(tmp_path, vocab) -> None:
    # 0.4 s is 41 mel frames, 6 encoder frames after 8x subsampling; the transcript has 11
    # labels: CTC cannot align it, a transducer can (several tokens per frame).
    import numpy as np
    import soundfile as sf

    path = tmp_path / "short.wav"
    sf.write(
        path, (0.1 * np.random.default_rng(0).standard_normal(6400)).astype(np.float32), 16_000
    )
    text = "".join(vocab.characters[:11])
    utt = [Utterance(path, text, 0.4)]
    tdt = _build("parakeet_tdt", vocab)
    assert len(SpeechDataset(utt, vocab, tdt.frontend, **tdt.label_rules())) == 1
    ctc_rule = {"output_frames": lambda n: -(-n // 8)}
    with pytest.raises(ConfigError, match="too_long_for_ctc"):
        SpeechDataset(utt, vocab, tdt.frontend, **ctc_rule)


def test_unsupported_family_names_the_supported_ones(vocab) -> None:
    with pytest.raises(ConfigError, match="whisper, parakeet_tdt"):
        build_asr_model(
            {"model_type": "bert", "architectures": ["BertModel"]}, vocab, pretrained=False
        )


# ------------------------------------------------------------------ loss normalisation


@pytest.mark.parametrize("family", FAMILIES)
def test_accumulated_micro_batches_equal_one_batch(family, corpus, vocab) -> None:
    asr = _build(family, vocab)
    asr.model.eval()  # no dropout: the same function in both runs
    data = _dataset(asr, corpus / "train.jsonl", vocab)
    order = sorted(range(len(data)), key=lambda i: data.durations[i])
    picked = [order[0], order[2], order[5], order[7]]  # lengths differ: the batches pad differently

    reference = {n: p.detach().clone() for n, p in asr.model.named_parameters()}
    loss_sum, units = asr.loss_fn(asr.model, pad_collate([data[i] for i in picked]))
    assert units == asr.units_fn(pad_collate([data[i] for i in picked]))
    asr.model.zero_grad()
    (loss_sum / units).backward()
    want = [p.grad.detach().clone() for p in asr.model.parameters() if p.requires_grad]
    asr.model.zero_grad()

    optimizer = RecordingSGD([p for p in asr.model.parameters() if p.requires_grad], lr=0.0)
    config = TrainingConfig(gradient_accumulation_steps=2, warmup_steps=0, max_grad_norm=0.0)
    trainer = _trainer(asr, config, optimizer)
    trainer.train([picked[:3], picked[3:]], dataset=data, max_steps=1)

    assert trainer.history[0].micro_batch_sizes == [3, 1]
    assert trainer.history[0].units == units
    assert trainer.history[0].loss == pytest.approx(float(loss_sum.detach()) / units, rel=1e-5)
    for got, ref in zip(optimizer.seen_grads, want, strict=True):
        # rtol 1e-5 of each tensor's scale: the TDT loss runs a ~60-step log-sum-exp recurrence
        # in fp32 whose rounding differs between a batch of 4 and batches of 3 and 1 by up to
        # ~1e-5 of the largest element. Attention key biases get no gradient in theory (a
        # softmax ignores a shift shared by all keys): theirs is rounding noise, ~1e-12.
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()) + 1e-9)
    for name, p in asr.model.named_parameters():
        assert torch.equal(p, reference[name]), name  # lr 0: nothing moved


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_loss_sum_of_a_batch_is_the_sum_over_its_utterances(family, corpus, vocab) -> None:
    """What makes accumulation exact: ``loss_sum`` adds up over utterances, whatever the padding."""
    asr = _build(family, vocab)
    asr.model.eval()
    data = _dataset(asr, corpus / "train.jsonl", vocab)
    batch_sum, batch_units = asr.loss_fn(asr.model, pad_collate([data[i] for i in range(4)]))
    alone = [asr.loss_fn(asr.model, pad_collate([data[i]])) for i in range(4)]
    assert batch_units == sum(units for _, units in alone)
    want_units = [
        len(data.labels[i]) if family == "whisper" else 1 for i in range(4)
    ]  # tokens / utterances
    assert [units for _, units in alone] == want_units
    assert float(batch_sum) == pytest.approx(sum(float(loss) for loss, _ in alone), rel=1e-5)


@torch.no_grad()
def test_whisper_units_are_tokens_so_a_mean_of_means_would_differ(corpus, vocab) -> None:
    """Guard that the tests above can fail: weighting Whisper's micro-batches by utterances is wrong."""
    asr = _build("whisper", vocab)
    asr.model.eval()
    data = _dataset(asr, corpus / "train.jsonl", vocab)
    a, b = pad_collate([data[0], data[1], data[2]]), pad_collate([data[3]])
    (sa, ua), (sb, ub) = asr.loss_fn(asr.model, a), asr.loss_fn(asr.model, b)
    assert (
        (ua, ub)
        == (asr.units_fn(a), asr.units_fn(b))
        == (int((a["labels"] >= 0).sum()), len(data.labels[3]))
    )
    exact, by_utterance = (sa + sb) / (ua + ub), (3 * sa / ua + sb / ub) / 4
    assert abs(float(exact - by_utterance)) > 1e-3 * float(exact)


# ------------------------------------------------------------------ training, saving, decoding


def test_loss_falls(trained) -> None:
    asr, history = trained
    losses = [record.loss for record in history]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    first, last = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    assert last < 0.75 * first, (asr.family, losses)


def test_saved_model_reloads_with_identical_greedy_predictions(
    trained, corpus, vocab, tmp_path
) -> None:
    asr, _ = trained
    dev = _dataset(asr, corpus / "dev.jsonl", vocab)
    first, loss = transcribe(asr.model, dev)
    asr.model.save_pretrained(tmp_path)
    vocab.save(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == asr.config.model_type
    loaded = auto_class_for(asr.family).from_pretrained(tmp_path)
    assert type(loaded) is type(asr.model)
    again, loss_again = transcribe(loaded, dev)
    assert again == first and loss_again == pytest.approx(loss, rel=1e-6)
    assert any(first), first  # the trained model emits characters, not only specials
    assert all(ch in set(vocab.characters) | {" "} for text in first for ch in text)


@pytest.mark.parametrize("trained", ["whisper"], indirect=True)
def test_whisper_cached_greedy_equals_a_full_recompute(trained, corpus, vocab) -> None:
    asr, _ = trained
    dev = _dataset(asr, corpus / "dev.jsonl", vocab)
    feats = pad_collate([dev[i] for i in range(len(dev))])["input_features"]
    got = whisper_greedy(asr.model, feats, max_length=40)
    config = asr.model.config
    with torch.no_grad():
        want = []
        for row in feats:
            tokens = [config.decoder_start_token_id]
            while len(tokens) < 40:
                logits = asr.model(
                    input_features=row[None], decoder_input_ids=torch.tensor([tokens])
                ).logits[0, -1]
                logits[[config.decoder_start_token_id, config.pad_token_id]] = -math.inf
                tokens.append(int(logits.argmax()))
                if tokens[-1] == config.eos_token_id:
                    break
            want.append([t for t in tokens[1:] if t != config.eos_token_id])
    assert got == want


@pytest.mark.parametrize("trained", ["parakeet_tdt"], indirect=True)
def test_tdt_batched_greedy_equals_each_utterance_alone(trained, corpus, vocab) -> None:
    asr, _ = trained
    dev = _dataset(asr, corpus / "dev.jsonl", vocab)
    batch = pad_collate([dev[i] for i in range(len(dev))])
    together = transducer_greedy(asr.model, batch["input_features"], batch["attention_mask"])
    alone = [
        transducer_greedy(
            asr.model, dev[i]["input_features"][None], dev[i]["attention_mask"][None]
        )[0]
        for i in range(len(dev))
    ]
    assert together == alone
    blank = asr.model.config.blank_token_id
    assert all(0 < t < blank for row in together for t in row)


# ------------------------------------------------------------------ a checkpoint with its own tokenizer


def _whisper_tokenizer(folder):
    """A real ``WhisperTokenizer`` over single letters (byte-level BPE without merges)."""
    from transformers import WhisperTokenizer

    folder.mkdir()
    letters = [*"abcdefghijklmnopqrstuvwxyz", "\u0120"]  # \u0120: byte-level BPE's space
    (folder / "vocab.json").write_text(json.dumps({c: i for i, c in enumerate(letters)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = WhisperTokenizer(
        str(folder / "vocab.json"), str(folder / "merges.txt")
    )  # <|endoftext|> = 27
    specials = [
        "<|startoftranscript|>",
        "<|en|>",
        "<|transcribe|>",
        "<|translate|>",
        "<|notimestamps|>",
    ]
    tokenizer.add_special_tokens({"additional_special_tokens": specials})
    return tokenizer


def test_a_pretrained_whisper_folder_keeps_its_own_tokenizer(tmp_path, corpus, vocab) -> None:
    from transformers import WhisperFeatureExtractor

    tokenizer = _whisper_tokenizer(tmp_path / "tok")
    eos, start = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|startoftranscript|>"])
    checkpoint = tmp_path / "checkpoint"
    base = _build("whisper", vocab).config.to_dict()
    base.update(
        vocab_size=len(tokenizer),
        eos_token_id=eos,
        pad_token_id=eos,
        bos_token_id=eos,
        decoder_start_token_id=start,
    )
    torch.manual_seed(0)
    original = auto_class_for("whisper").from_config(
        type(_build("whisper", vocab).config).from_dict(base)
    )
    original.save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    WhisperFeatureExtractor(feature_size=80, chunk_length=3).save_pretrained(checkpoint)

    asr = build_asr_model(str(checkpoint), vocab, pretrained=True)
    assert asr.pretrained and type(asr.vocab).__name__ == "PretrainedText"
    assert asr.config.vocab_size == len(tokenizer)  # not re-sized to the character vocabulary
    for name, p in asr.model.named_parameters():
        assert torch.equal(p, original.state_dict()[name]), name
    prefix = tokenizer.convert_tokens_to_ids(["<|transcribe|>", "<|notimestamps|>"])
    assert asr.label_rules() == {
        "label_prefix": tuple(prefix),
        "label_suffix": (eos,),
        "max_labels": 64,
    }
    data = _dataset(asr, corpus / "dev.jsonl", asr.vocab)
    text = data.texts[0]
    assert data[0]["labels"].tolist() == [
        *prefix,
        *tokenizer(text, add_special_tokens=False)["input_ids"],
        eos,
    ]
    assert asr.vocab.decode(tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]) == text
    hypotheses, loss = transcribe(
        asr.model, data
    )  # forced prompt: start, transcribe, no timestamps
    assert len(hypotheses) == len(data) and math.isfinite(loss)
    from transformers import AutoTokenizer

    asr.vocab.save(tmp_path / "saved")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert (
        reloaded(text, add_special_tokens=False)["input_ids"]
        == tokenizer(text, add_special_tokens=False)["input_ids"]
    )
    assert (tmp_path / "saved" / "asrfit_text.json").is_file()


def test_a_missing_tokenizer_falls_back_to_the_characters(tmp_path, vocab, caplog) -> None:
    checkpoint = tmp_path / "checkpoint"
    _build("whisper", vocab).model.save_pretrained(checkpoint)  # weights, no tokenizer
    asr = build_asr_model(str(checkpoint), vocab, pretrained=True)
    assert asr.pretrained and asr.vocab is vocab and asr.config.vocab_size == len(vocab) + 2
    assert (
        "its tokenizer has 1 tokens for the model's vocab_size" in caplog.text
    )  # transformers' empty one


# ------------------------------------------------------------------ the CLI


def test_cli_trains_a_tiny_whisper_for_an_epoch(corpus, tmp_path) -> None:
    from click.testing import CliRunner

    from asrfit.cli.main import cli

    sets = [arg for key, value in TINY["whisper"].items() for arg in ("--set", f"{key}={value}")]
    out = tmp_path / "run"
    result = CliRunner().invoke(
        cli,
        [
            "train",
            "--model",
            "whisper-tiny",
            "--random-init",
            *sets,
            "--data",
            str(corpus / "train.jsonl"),
            "--dev",
            str(corpus / "dev.jsonl"),
            "--test",
            str(corpus / "test.jsonl"),
            "--out",
            str(out),
            "--gpu",
            "auto",
            "--epochs",
            "1",
            "--target-batch",
            "8",
            "--lr",
            "3e-3",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["model_class"] == "WhisperForConditionalGeneration"
    assert len(report["epochs"]) == 1 and report["epochs"][0]["dev"] is not None
    # CER's ceiling by construction: per utterance the edit distance is at most the longer of
    # reference and hypothesis, and greedy decoding stops at max_target_positions decoder
    # positions, the start token one of them: at most 63 one-character tokens
    longest = TINY["whisper"]["max_target_positions"] - 1
    references = [
        json.loads(line)["text"] for line in (corpus / "test.jsonl").read_text().splitlines()
    ]
    ceiling = sum(max(len(r), longest) for r in references) / sum(len(r) for r in references)
    assert report["test"] is not None and 0.0 <= report["test"]["cer"] <= ceiling
    assert (out / "best" / "config.json").is_file() and (out / "best" / "vocab.json").is_file()
    # the folder reloads through Hugging Face with a decoder's tokenizer: repeats kept (CTC's
    # merging would write "kate bobas"), and the ASR pipeline runs on it
    from transformers import AutoProcessor, pipeline

    processor = AutoProcessor.from_pretrained(out / "best", trust_remote_code=True)
    assert type(processor.tokenizer).__name__ == "CharSeq2SeqTokenizer"
    ids = processor.tokenizer("katte bobbas").input_ids
    assert (
        processor.batch_decode([ids + [len(processor.tokenizer)]])[0] == "katte bobbas"
    )  # end of text dropped
    row = json.loads((corpus / "dev.jsonl").read_text().splitlines()[0])
    import soundfile as sf

    wav, rate = sf.read(corpus / row["audio_filepath"], dtype="float32")
    asr = pipeline("automatic-speech-recognition", model=str(out / "best"), trust_remote_code=True)
    text = asr({"raw": wav, "sampling_rate": rate}, generate_kwargs={"max_new_tokens": 20})["text"]
    assert isinstance(text, str) and set(text) <= set(processor.tokenizer.get_vocab()) | {" "}
