"""espeak-ng through ctypes, from the ``espeakng-loader`` wheel (an optional extra).

espeak-ng is GPL-3.0: asrfit ships none of it. The library and its voice data come from the
``espeakng-loader`` wheel (``pip install 'asrfit[speech]'``), loaded here at run time with
:mod:`ctypes`. The library keeps one global synthesizer per process, so :class:`EspeakVoice`
is a process-wide singleton; render from one thread.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path

import numpy as np

from asrfit.errors import AsrfitError, AudioError

logger = logging.getLogger(__name__)

INSTALL_HINT = "install it with `pip install 'asrfit[speech]'` (the espeakng-loader wheel)"

# enums of speak_lib.h
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_PARAM_RATE, _PARAM_VOLUME, _PARAM_PITCH, _PARAM_RANGE, _PARAM_WORDGAP = 1, 2, 3, 4, 7
_EE_OK = 0

_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p
)


def _loader():  # noqa: ANN202 - the module object
    try:
        import espeakng_loader
    except ImportError as exc:
        raise AsrfitError(
            f"speech synthesis needs espeak-ng, which is not installed; {INSTALL_HINT}."
        ) from exc
    return espeakng_loader


def data_path() -> Path:
    """Folder of espeak-ng's voice data inside the ``espeakng-loader`` wheel.

    Raises:
        AsrfitError: When ``espeakng-loader`` is not installed.
    """
    return Path(_loader().get_data_path())


class Espeak:
    """The espeak-ng library of this process, rendering text to 16-bit PCM in memory.

    Use :meth:`get`; the library holds one synthesizer per process, so there is one instance.
    """

    _instance: Espeak | None = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        loader = _loader()
        lib_path, data = loader.get_library_path(), loader.get_data_path()
        try:
            lib = ctypes.CDLL(lib_path)
        except OSError as exc:
            raise AsrfitError(
                f"{lib_path}: cannot load libespeak-ng ({exc}); reinstall espeakng-loader."
            ) from exc
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        lib.espeak_Initialize.restype = ctypes.c_int
        lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.espeak_Synth.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        lib.espeak_SetSynthCallback.argtypes = [_CALLBACK]
        lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
        self._libc = ctypes.CDLL(None)  # espeak-ng also draws from libc's rand()
        # espeak_Initialize takes the folder that holds espeak-ng-data
        rate = lib.espeak_Initialize(
            _AUDIO_OUTPUT_SYNCHRONOUS, 0, str(Path(data).parent).encode(), 0
        )
        if rate <= 0:
            raise AsrfitError(
                f"espeak_Initialize failed ({rate}) with data in {data}; reinstall espeakng-loader."
            )
        self.sample_rate = int(rate)
        self._lib = lib
        self._chunks: list[np.ndarray] = []
        self._callback = _CALLBACK(self._collect)  # kept alive: the library holds the pointer
        lib.espeak_SetSynthCallback(self._callback)
        logger.debug("espeak-ng loaded from %s (%d Hz)", lib_path, self.sample_rate)

    @classmethod
    def get(cls) -> Espeak:
        """The process's espeak-ng (loaded on first use).

        Raises:
            AsrfitError: When ``espeakng-loader`` is missing or the library does not load.
        """
        with cls._lock:
            if cls._instance is None:
                cls._instance = Espeak()
            return cls._instance

    def _collect(self, wav, num_samples: int, _events) -> int:  # noqa: ANN001 - ctypes pointers
        if num_samples > 0:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(num_samples,)).copy())
        return 0  # go on

    def render(
        self,
        text: str,
        voice: str,
        *,
        rate_wpm: int = 175,
        pitch: int = 50,
        pitch_range: int = 50,
        word_gap: int = 0,
        seed: int = 0,
    ) -> np.ndarray:
        """Speak ``text`` with ``voice`` (e.g. ``"en-US+m3"``); float32 mono at :attr:`sample_rate`.

        Args:
            text: What to say (UTF-8).
            voice: An espeak-ng voice name, optionally ``+variant``.
            rate_wpm: Speed in words per minute (80-450).
            pitch: Base pitch, 0-100.
            pitch_range: Pitch range, 0-100 (0 is a monotone).
            word_gap: Extra pause between words, in units of 10 ms.
            seed: Seeds espeak-ng's own noise (breath, frication) and libc's ``rand()``. The
                library also keeps state of its own from one render to the next, which
                ``espeak_Terminate`` and ``espeak_Initialize`` do not reset, so the same
                arguments give slightly different samples after other renders: the samples
                are fixed by the arguments and by every render before them in this process
                (:mod:`asrfit.recipes.speech.corpus` renders in fixed shards for it).

        Raises:
            AudioError: When espeak-ng rejects the voice or the text, or renders nothing.
        """
        with self._lock:
            lib = self._lib
            if lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
                raise AudioError(
                    f"espeak-ng has no voice {voice!r}; see asrfit.recipes.speech.voices for names."
                )
            for param, value in (
                (_PARAM_RATE, rate_wpm),
                (_PARAM_PITCH, pitch),
                (_PARAM_RANGE, pitch_range),
                (_PARAM_WORDGAP, word_gap),
                (_PARAM_VOLUME, 100),
            ):
                lib.espeak_SetParameter(param, int(value), 0)
            self._chunks = []
            lib.espeak_ng_SetRandSeed(int(seed))
            self._libc.srand(ctypes.c_uint(int(seed) & 0xFFFFFFFF))
            data = text.encode("utf-8") + b"\0"
            status = lib.espeak_Synth(
                data, len(data), 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None
            )
            if status != _EE_OK:
                raise AudioError(f"espeak-ng failed ({status}) on {text!r} with voice {voice!r}.")
            chunks, self._chunks = self._chunks, []
        if not chunks:
            raise AudioError(f"espeak-ng rendered no audio for {text!r} with voice {voice!r}.")
        return np.concatenate(chunks).astype(np.float32) / 32768.0
