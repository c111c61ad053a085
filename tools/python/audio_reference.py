"""The Hugging Face side of the audio checks, shared by make_audio_golden.py (committed goldens) and
check_audio_external.py (the live ctest): test signals, transformers' Gemma4AudioFeatureExtractor and the soft-token
counts of Gemma4Processor, and transformers' own `load_audio` (soundfile + soxr 'soxr_hq', as librosa) for decoding.

Nothing here reimplements the reference: the features, masks and token counts are transformers' code run as is.
"""
import types

import numpy as np
from transformers import Gemma4AudioFeatureExtractor
from transformers.audio_utils import load_audio
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

SAMPLE_RATE = 16000
BOA, AUDIO, EOA = "<|audio>", "<|audio|>", "<audio|>"


def int16_signal(x):
    """x (floats in [-1, 1]) rounded to 16-bit PCM steps: exact in float32 and storable as int16."""
    return np.clip(np.round(np.asarray(x) * 32767), -32768, 32767).astype(np.int16)


def test_signals(seed=0):
    """name -> int16 samples at 16 kHz: tones, a sweep, noise, silence, and clips around the framing edges."""
    rng = np.random.default_rng(seed)
    t = lambda seconds: np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    s = {
        "sine_440": int16_signal(0.5 * np.sin(2 * np.pi * 440 * t(0.5))),
        "sweep": int16_signal(0.8 * np.sin(2 * np.pi * (50 * t(1.0) + 3500 * t(1.0) ** 2))),
        "noise": int16_signal(np.clip(0.3 * rng.standard_normal(len(t(0.5))), -1, 1)),
        "silence": np.zeros(len(t(0.3)), np.int16),
        "quiet_noise": int16_signal(1e-3 * rng.standard_normal(len(t(0.25)))),
        "odd_length": int16_signal(0.4 * np.sin(2 * np.pi * 1234.5 * t(0.3)) + 0.1 * rng.standard_normal(len(t(0.3)))),
    }
    # Around the first frame and the padding multiple: no frame, one frame, the mask's edges.
    for n in (100, 129, 200, 321, 481, 1000):
        s[f"short_{n}"] = int16_signal(0.5 * rng.uniform(-1, 1, n))
    return s


def long_segment(seed=1):
    """One second of 16-bit noise and tones; tiled 33 times it is longer than the extractor's 30 s cut."""
    rng = np.random.default_rng(seed)
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    return int16_signal(0.3 * np.sin(2 * np.pi * 300 * t) + 0.1 * rng.standard_normal(SAMPLE_RATE))


LONG_REPEATS = 33


def to_float(pcm):
    return (pcm.astype(np.float32) / np.float32(32768)).astype(np.float32)


def extractor(options=None):
    return Gemma4AudioFeatureExtractor(**(options or {}))


def hf_features(waveform, options=None):
    """(features [frames, mel] float32, mask [frames] uint8) for one clip, as Gemma4Processor calls the extractor."""
    out = extractor(options)([np.asarray(waveform, np.float32)], return_tensors="np")
    return out["input_features"][0].astype(np.float32), out["input_features_mask"][0].astype(np.uint8)


def hf_soft_tokens(mask, num_samples, audio_seq_length=750):
    """(Gemma4Processor.replace_audio_token's count, its _compute_audio_num_tokens count): the processor's prompt
    expansion and the waveform-length arithmetic vLLM copies, both run on a stand-in `self`."""
    me = types.SimpleNamespace(boa_token=BOA, audio_token=AUDIO, eoa_token=EOA)
    text = Gemma4Processor.replace_audio_token(me, {"input_features_mask": [mask.astype(bool)]}, 0)
    assert text.startswith(BOA) and text.endswith(EOA)
    from_mask = text[len(BOA) : len(text) - len(EOA)].count(AUDIO)
    me = types.SimpleNamespace(feature_extractor=extractor(), audio_seq_length=audio_seq_length)
    from_length = Gemma4Processor._compute_audio_num_tokens(me, np.zeros(num_samples), SAMPLE_RATE)
    return from_mask, from_length


def hf_load_audio(path):
    """transformers' decoder: soundfile, mean of channels, soxr 'soxr_hq' to 16 kHz, ceil-length (= librosa.load)."""
    return load_audio(str(path), sampling_rate=SAMPLE_RATE, backend="soundfile")


# Feature-extractor blocks of processor_config.json beyond the defaults: every option the extractor has that
# qatserve reads (dither is refused, being random).
OPTION_VARIANTS = {
    "variant_htk": {"frame_length_ms": 25.0, "hop_length_ms": 12.5, "preemphasis": 0.97, "fft_overdrive": True,
                    "mel_floor": 1e-5, "feature_size": 80, "min_frequency": 60.0, "max_frequency": 7600.0},
    "variant_plain": {"preemphasis": 0.5, "preemphasis_htk_flavor": False, "input_scale_factor": 2.0,
                      "per_bin_mean": [0.01 * i - 0.5 for i in range(128)],
                      "per_bin_stddev": [1.0 + 0.02 * i for i in range(128)]},
}
