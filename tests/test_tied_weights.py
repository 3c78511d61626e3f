"""Parameters used twice (tied embeddings) against PLAIN real CPU steps (bench/_truth.py).

When a weight is used twice, autograd sums its two gradients in the engine's input buffer.
``F.linear`` hands its weight gradient over as a view (``weight.t()``'s backward), whose
base keeps the storage alive, so even a plain step sums out of place: three
vocabulary-by-width tensors live at once. The references are the c10 CPU allocator's own
counts of real steps run with no dispatch mode active; the vocabularies are large enough
that one vocabulary-by-width tensor is many times the tolerance.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn

from asrfit.memory import simulate_model
from asrfit.memory.models.generic import speech_adapter
from asrfit.memory.setup import Setup
from asrfit.memory.simulate import simulate_step
from asrfit.memory.step import BatchShape
from bench import _truth

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 20000


def _whisper(width: int) -> transformers.WhisperConfig:
    config = transformers.WhisperConfig(
        d_model=width,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=2 * width,
        decoder_ffn_dim=2 * width,
        num_mel_bins=32,
        max_source_positions=100,
        max_target_positions=32,
        vocab_size=VOCAB,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )
    config.architectures = ["WhisperForConditionalGeneration"]
    return config


def _speech_to_text(width: int) -> transformers.Speech2TextConfig:
    config = transformers.Speech2TextConfig(
        d_model=width,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=2 * width,
        decoder_ffn_dim=2 * width,
        vocab_size=VOCAB,
        input_feat_per_channel=40,
        conv_channels=16,
        max_source_positions=500,
        max_target_positions=32,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
    )
    config.architectures = ["Speech2TextForConditionalGeneration"]
    return config


@pytest.mark.parametrize(
    ("make_config", "batch", "setup"),
    [
        (_whisper, BatchShape(2, 200, 10), Setup(precision="fp32", optimizer="adamw")),
        (
            _whisper,
            BatchShape(2, 200, 10),
            Setup(precision="bf16", gradient_checkpointing=True, optimizer="sgd"),
        ),
        (_whisper, BatchShape(2, 200, 10), Setup(precision="pure_bf16", optimizer="adafactor")),
        (_speech_to_text, BatchShape(2, 120, 8), Setup(precision="fp32", optimizer="sgd")),
    ],
    ids=["whisper-fp32", "whisper-bf16-ckpt", "whisper-pure-bf16", "speech_to_text-fp32"],
)
def test_tied_output_projection_matches_the_plain_step(make_config, batch, setup) -> None:
    width = 48
    config = make_config(width)
    assert config.tie_word_embeddings
    truth = _truth.measure_adapter_step(speech_adapter(make_config(width)), batch, setup)
    sim = simulate_step(speech_adapter(config), batch, setup, target="cpu")
    tied_bytes = VOCAB * width * (2 if setup.precision == "pure_bf16" else 4)
    tolerance = 0.002 * truth.peak_bytes
    assert tied_bytes > 10 * tolerance  # the vocabulary-sized sum is far above the tolerance
    assert sim.peak_raw_bytes == pytest.approx(truth.peak_bytes, abs=tolerance)


class _TiedLm(nn.Module):
    """An embedding whose weight is also the output projection (``F.linear``)."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.mix(self.embed(tokens)))
        logits = F.linear(hidden, self.embed.weight)
        return F.cross_entropy(logits.flatten(0, 1), tokens.flatten())


class _TwiceLinear(nn.Module):
    """One linear weight applied twice: both gradients arrive as views of a matmul."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.proj(x))).square().mean()


def _sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)


def test_tied_embedding_module_matches_the_plain_step() -> None:
    vocab, width = 30000, 32

    def make() -> torch.Tensor:
        return torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))

    def loss(m: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        return m(tokens)

    torch.manual_seed(0)
    model = _TiedLm(vocab, width)
    truth = _truth.measure_plain_step(model, make, loss, _sgd(model)).peak_bytes
    setup = Setup(optimizer="sgd")
    sim = simulate_model(lambda: _TiedLm(vocab, width), make, loss, setup=setup, target="cpu")
    momentum = sum(4 * p.numel() for p in model.parameters())
    assert 4 * vocab * width > 0.1 * truth  # one vocabulary-sized tensor is 10 % of the step
    assert sim.peak_raw_bytes - momentum == pytest.approx(truth, rel=0.002)


def test_weight_used_twice_matches_the_plain_step() -> None:
    width, rows = 1024, 8

    def make() -> torch.Tensor:
        return torch.randn(rows, width)

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x)

    model = _TwiceLinear(width)
    truth = _truth.measure_plain_step(model, make, loss, _sgd(model)).peak_bytes
    setup = Setup(optimizer="sgd")
    sim = simulate_model(lambda: _TwiceLinear(width), make, loss, setup=setup, target="cpu")
    momentum = 4 * width * width
    assert sim.peak_raw_bytes - momentum == pytest.approx(truth, rel=0.002)
