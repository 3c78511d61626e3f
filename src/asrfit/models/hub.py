"""Saved models that load without asrfit: transformers' custom-code convention.

:func:`write_remote_code` copies the built-in Conformer's own modules (config, layers,
decoder, modeling, dropout, log-mel features, feature extractor, and the small asrfit modules they use)
into its model folder, with their ``from asrfit...`` imports made relative, and writes the
``auto_map`` entries that point transformers at them. Then, in a Python that has no asrfit::

    AutoModelForCTC.from_pretrained(folder, trust_remote_code=True)
    AutoFeatureExtractor.from_pretrained(folder, trust_remote_code=True)
    AutoProcessor.from_pretrained(folder, trust_remote_code=True)   # a Wav2Vec2Processor
    pipeline("automatic-speech-recognition", model=folder, trust_remote_code=True)

load the same classes and compute the same features, logits and greedy transcripts. The files
are copies of the code that trained the model, not a second implementation. Where asrfit is
imported, its registered classes take precedence (transformers prefers explicitly registered
local code), so asrfit keeps loading its own folders with its own classes.

:func:`write_tokenizer_code` is the tokenizer part alone, for the CTC models transformers
ships (wav2vec2, HuBERT, WavLM, Parakeet-CTC) trained with asrfit's character vocabulary: they
load natively, and with ``trust_remote_code=True`` the pipeline decodes as asrfit does
(:mod:`asrfit.models.char_tokenizer`).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

from asrfit.errors import ConfigError
from asrfit.utils.io import Pathlike, atomic_write_text
from asrfit.version import __version__

_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the asrfit package

# asrfit module -> its file in the model folder (transformers names: configuration_*, modeling_*...)
TOKENIZER_FILES: dict[str, str] = {
    "asrfit.models.ctc": "asrfit_ctc.py",
    "asrfit.models.char_tokenizer": "tokenization_asrfit_ctc.py",
}
REMOTE_FILES: dict[str, str] = {
    "asrfit.errors": "asrfit_errors.py",
    "asrfit.models.logmel": "asrfit_logmel.py",
    "asrfit.models.dropout": "asrfit_dropout.py",
    "asrfit.models.conformer.config": "configuration_asrfit_conformer.py",
    "asrfit.models.conformer.layers": "asrfit_conformer_layers.py",
    "asrfit.models.conformer.decoder": "asrfit_conformer_decoder.py",
    "asrfit.models.conformer.modeling": "modeling_asrfit_conformer.py",
    "asrfit.models.conformer.feature_extraction": "feature_extraction_asrfit_conformer.py",
    **TOKENIZER_FILES,
}

# config file -> the entries merged into it. processor_class: AutoProcessor then builds the
# processor with trust_remote_code passed on to AutoTokenizer (through a model type's own
# processor it would not be, and the tokenizer would load as the plain Wav2Vec2CTCTokenizer).
TOKENIZER_AUTO_MAPS: dict[str, dict[str, Any]] = {
    "tokenizer_config.json": {
        "auto_map": {"AutoTokenizer": ["tokenization_asrfit_ctc.CharCTCTokenizer", None]}
    },
    "preprocessor_config.json": {"processor_class": "Wav2Vec2Processor"},
}
# The same for Whisper trained on the character vocabulary: the decoder's tokenizer, in
# Whisper's processor (its feature extractor is Whisper's own).
SEQ2SEQ_TOKENIZER_AUTO_MAPS: dict[str, dict[str, Any]] = {
    "tokenizer_config.json": {
        "auto_map": {"AutoTokenizer": ["tokenization_asrfit_ctc.CharSeq2SeqTokenizer", None]}
    },
    "preprocessor_config.json": {"processor_class": "WhisperProcessor"},
}
AUTO_MAPS: dict[str, dict[str, Any]] = {
    "config.json": {
        "auto_map": {
            "AutoConfig": "configuration_asrfit_conformer.ConformerCTCConfig",
            "AutoModelForCTC": "modeling_asrfit_conformer.ConformerForCTC",
        }
    },
    "preprocessor_config.json": {
        "auto_map": {
            "AutoFeatureExtractor": "feature_extraction_asrfit_conformer.ConformerFeatureExtractor"
        },
        **TOKENIZER_AUTO_MAPS["preprocessor_config.json"],
    },
    "tokenizer_config.json": TOKENIZER_AUTO_MAPS["tokenizer_config.json"],
}

_FROM_ASRFIT = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<module>asrfit(?:\.\w+)*) import ", re.MULTILINE
)


def _source_path(module: str) -> Path:
    return _ROOT.joinpath(*module.split(".")).with_suffix(".py")


def relative_source(module: str) -> str:
    """``module``'s source with every ``from asrfit.X import`` made ``from .<file of X> import``.

    Raises:
        ConfigError: When the module imports an asrfit module that is not copied (every one
            it needs must be in :data:`REMOTE_FILES`), or imports asrfit another way.
    """
    text = _source_path(module).read_text(encoding="utf-8")

    def relative(match: re.Match[str]) -> str:
        target = match["module"]
        if target not in REMOTE_FILES:
            raise ConfigError(
                f"{module} imports {target}, which is not in asrfit.models.hub.REMOTE_FILES; "
                "add it there (it must import only torch, transformers, numpy and those files)."
            )
        return f"{match['indent']}from .{REMOTE_FILES[target].removesuffix('.py')} import "

    text = _FROM_ASRFIT.sub(relative, text)
    for node in ast.walk(ast.parse(text)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        if any(name == "asrfit" or name.startswith("asrfit.") for name in names):
            raise ConfigError(f"{module}: an asrfit import the copy cannot make relative: {names}.")
    header = (
        f"# Copied from asrfit {__version__} ({module}) with its asrfit imports made relative,\n"
        "# so this model folder loads with transformers alone (trust_remote_code=True).\n"
    )
    return header + text


def _require(out: Path, names: list[str]) -> None:
    for name in names:
        if not (out / name).is_file():
            raise ConfigError(
                f"{out / name}: missing; save the model, its feature extractor and its "
                "tokenizer into the folder before its remote code."
            )


def _write(out: Path, files: dict[str, str], maps: dict[str, dict[str, Any]]) -> list[Path]:
    written = [
        atomic_write_text(out / name, relative_source(module)) for module, name in files.items()
    ]
    for name, entries in maps.items():
        data = json.loads((out / name).read_text(encoding="utf-8"))
        data.update(entries)
        text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        written.append(atomic_write_text(out / name, text))
    return written


_SAFE_LOADS: dict[str, str] = {
    "asrfit_conformer": (
        "from asrfit.models.char_tokenizer import CharCTCTokenizer\n"
        "from asrfit.models.conformer import ConformerForCTC\n"
        "from asrfit.models.conformer.feature_extraction import ConformerFeatureExtractor\n\n"
        "model = ConformerForCTC.from_pretrained(folder)\n"
        "features = ConformerFeatureExtractor.from_pretrained(folder)\n"
        "tokenizer = CharCTCTokenizer.from_pretrained(folder)\n"
    ),
    "ctc": (
        "from transformers import AutoFeatureExtractor, AutoModelForCTC\n"
        "from asrfit.models.char_tokenizer import CharCTCTokenizer\n\n"
        "model = AutoModelForCTC.from_pretrained(folder)  # transformers' own class\n"
        "features = AutoFeatureExtractor.from_pretrained(folder)\n"
        "tokenizer = CharCTCTokenizer.from_pretrained(folder)\n"
    ),
    "seq2seq": (
        "from transformers import AutoFeatureExtractor, AutoModelForSpeechSeq2Seq\n"
        "from asrfit.models.char_tokenizer import CharSeq2SeqTokenizer\n\n"
        "model = AutoModelForSpeechSeq2Seq.from_pretrained(folder)  # transformers' own class\n"
        "features = AutoFeatureExtractor.from_pretrained(folder)\n"
        "tokenizer = CharSeq2SeqTokenizer.from_pretrained(folder)\n"
    ),
}


def write_model_card(folder: Pathlike, kind: str) -> Path:
    """Write ``README.md`` into a saved model folder: what it holds, which of its files are
    code that ``trust_remote_code=True`` runs, and how to load it without running them.

    Args:
        folder: A model folder with its weights (``model.safetensors``) and any code files.
        kind: ``"asrfit_conformer"`` (the built-in Conformer, its code in the folder),
            ``"ctc"`` (a transformers CTC model with the character tokenizer's code) or
            ``"seq2seq"`` (Whisper with it).

    Returns:
        The card's path.

    Raises:
        ConfigError: On another ``kind``.
    """
    if kind not in _SAFE_LOADS:
        raise ConfigError(f"write_model_card: kind={kind!r}; give one of {sorted(_SAFE_LOADS)}.")
    out = Path(folder)
    code = sorted(p.name for p in out.glob("*.py"))
    weights = sorted(p.name for p in out.glob("*.safetensors"))
    listing = "\n".join(f"- `{name}`" for name in code) or "- (none)"
    text = (
        "---\nlibrary_name: transformers\npipeline_tag: automatic-speech-recognition\n"
        f"tags:\n- asrfit\n---\n\n# Speech recogniser trained with asrfit {__version__}\n\n"
        f"Weights: {', '.join(f'`{w}`' for w in weights)} (safetensors: loading them runs no "
        "code). `plan.json` is the memory plan it trained with; `scores.json` its dev scores.\n\n"
        "## Remote code\n\nThese files are Python code, copied from asrfit, that transformers "
        "imports and runs when the folder is loaded with `trust_remote_code=True` (the `auto_map` "
        "entries of the config files point at them):\n\n"
        f"{listing}\n\nRead them before trusting them, or load the folder without running "
        "any of them: with asrfit installed (`pip install asrfit`), asrfit's own classes read "
        "the same files (the weights from safetensors, the rest from JSON):\n\n"
        f'```python\nfolder = "path/to/this/folder"\n{_SAFE_LOADS[kind]}```\n\n'
        "Without asrfit, the folder loads only with `trust_remote_code=True`, which runs the "
        "files listed above.\n"
    )
    return atomic_write_text(out / "README.md", text)


def write_remote_code(folder: Pathlike) -> list[Path]:
    """Copy the built-in Conformer's code into a saved model ``folder`` and add the ``auto_map``
    entries to its ``config.json``, ``preprocessor_config.json`` and ``tokenizer_config.json``.

    Args:
        folder: A folder with a built-in Conformer's ``config.json`` (``save_pretrained``),
            its feature extractor config and its tokenizer files.

    Returns:
        The files written.

    Raises:
        ConfigError: When a config file is missing or the model is not the built-in Conformer.
    """
    from asrfit.models.conformer.config import MODEL_TYPE

    out = Path(folder)
    _require(out, list(AUTO_MAPS))
    model_type = json.loads((out / "config.json").read_text(encoding="utf-8")).get("model_type")
    if model_type != MODEL_TYPE:
        raise ConfigError(
            f"{out / 'config.json'}: model_type {model_type!r}; only asrfit's built-in "
            f"Conformer ({MODEL_TYPE!r}) carries its code into the folder (for another model, "
            "write_tokenizer_code)."
        )
    return _write(out, REMOTE_FILES, AUTO_MAPS)


def write_tokenizer_code(folder: Pathlike, seq2seq: bool = False) -> list[Path]:
    """Copy asrfit's character CTC tokenizer into ``folder`` (which holds a
    ``tokenizer_config.json`` written by :meth:`~asrfit.data.text.CharVocabulary.save` and the
    model's ``preprocessor_config.json``) and point its ``auto_map`` at it; with ``seq2seq``
    (a Whisper model trained on the characters) at its encoder-decoder variant, in Whisper's
    processor.

    Returns:
        The files written.

    Raises:
        ConfigError: When one of the two config files is missing.
    """
    out = Path(folder)
    maps = SEQ2SEQ_TOKENIZER_AUTO_MAPS if seq2seq else TOKENIZER_AUTO_MAPS
    _require(out, list(maps))
    return _write(out, TOKENIZER_FILES, maps)


__all__ = [
    "AUTO_MAPS",
    "REMOTE_FILES",
    "SEQ2SEQ_TOKENIZER_AUTO_MAPS",
    "TOKENIZER_AUTO_MAPS",
    "TOKENIZER_FILES",
    "relative_source",
    "write_remote_code",
    "write_tokenizer_code",
]
