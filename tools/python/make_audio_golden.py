#!/usr/bin/env python3
"""make_audio_golden.py: the committed audio oracles for tests/audio_features_test.cc and tests/audio_decode_test.cc.

tests/golden/audio/features.safetensors, per test signal NAME (audio_reference.test_signals: 16-bit PCM at 16 kHz):
  NAME.pcm (I16), NAME.features (F32 [frames, mel]), NAME.mask (U8 [frames]), NAME.soft_tokens (I64 [2]: the
  counts of Gemma4Processor.replace_audio_token and of _compute_audio_num_tokens)
all from transformers' Gemma4AudioFeatureExtractor at its defaults; `long.*` is a 1 s segment tiled 33 times (cut to
30 s by the extractor), of which only some rows are kept (long.rows, I64) to stay small; and for each of
OPTION_VARIANTS a processor_config.json in tests/golden/audio/VARIANT/ with the features of `sweep` that
transformers' extractor computes when loaded from that directory (VARIANT.features, VARIANT.mask).

tests/data/audio/*: small encoded clips written by the `soundfile` package (its own libsndfile build) and
tests/golden/audio/decoded.safetensors: what transformers' `load_audio` (soundfile + soxr_hq) decodes from each.
"""
import json
import shutil
from pathlib import Path

import numpy as np
import soundfile as sf
from safetensors.numpy import save_file
from transformers import Gemma4AudioFeatureExtractor

import audio_reference as ref

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "audio"
DATA = REPO / "tests" / "data" / "audio"
LONG_ROWS = [0, 1, 2, 1499, 1500, 2997, 2998]

# name -> (rate, channels, soundfile format, subtype): every container decode_audio reads, rates that need
# resampling (up and down), and a stereo mix-down.
CLIPS = {
    "pcm16_mono_16k.wav": (16000, 1, "WAV", "PCM_16"),
    "float_stereo_11k025.wav": (11025, 2, "WAV", "FLOAT"),
    "pcm24_mono_8k.flac": (8000, 1, "FLAC", "PCM_24"),
    "vorbis_stereo_48k.ogg": (48000, 2, "OGG", "VORBIS"),
    "opus_mono_48k.opus": (48000, 1, "OGG", "OPUS"),
    "mp3_mono_22k05.mp3": (22050, 1, "MP3", "MPEG_LAYER_III"),
}
CLIP_SECONDS = 0.25


def clip_signal(rate, channels, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(int(CLIP_SECONDS * rate)) / rate
    chans = [0.4 * np.sin(2 * np.pi * (330 + 110 * c) * t) + 0.05 * rng.standard_normal(len(t)) for c in range(channels)]
    return np.stack(chans, axis=1).astype(np.float32)


def feature_goldens():
    tensors = {}
    for name, pcm in ref.test_signals().items():
        features, mask = ref.hf_features(ref.to_float(pcm))
        from_mask, from_length = ref.hf_soft_tokens(mask, len(pcm))
        assert from_mask == from_length, (name, from_mask, from_length)
        tensors |= {f"{name}.pcm": pcm, f"{name}.features": features, f"{name}.mask": mask,
                    f"{name}.soft_tokens": np.array([from_mask, from_length], np.int64)}
    segment = ref.long_segment()
    pcm = np.tile(segment, ref.LONG_REPEATS)
    features, mask = ref.hf_features(ref.to_float(pcm))
    from_mask, from_length = ref.hf_soft_tokens(mask, len(pcm))
    assert features.shape[0] == 2999 and from_mask == from_length == 750, (features.shape, from_mask, from_length)
    tensors |= {"long.segment": segment, "long.repeats": np.array([ref.LONG_REPEATS], np.int64),
                "long.rows": np.array(LONG_ROWS, np.int64), "long.features": features[LONG_ROWS],
                "long.mask": mask, "long.soft_tokens": np.array([from_mask, from_length], np.int64)}
    sweep = ref.to_float(ref.test_signals()["sweep"])
    for variant, block in ref.OPTION_VARIANTS.items():
        directory = GOLDEN / variant
        directory.mkdir(parents=True, exist_ok=True)
        config = {"audio_seq_length": 750, "feature_extractor": {"feature_extractor_type": "Gemma4AudioFeatureExtractor",
                                                                  **block}}
        (directory / "processor_config.json").write_text(json.dumps(config, indent=2) + "\n")
        extractor = Gemma4AudioFeatureExtractor.from_pretrained(directory)  # transformers reads the file itself
        out = extractor([sweep], return_tensors="np")
        tensors |= {f"{variant}.features": out["input_features"][0].astype(np.float32),
                    f"{variant}.mask": out["input_features_mask"][0].astype(np.uint8)}
    save_file(tensors, str(GOLDEN / "features.safetensors"))


def decode_goldens():
    DATA.mkdir(parents=True, exist_ok=True)
    decoded = {}
    for i, (name, (rate, channels, fmt, subtype)) in enumerate(CLIPS.items()):
        path = DATA / name
        sf.write(str(path), clip_signal(rate, channels, seed=10 + i), rate, format=fmt, subtype=subtype)
        decoded[name] = ref.hf_load_audio(path).astype(np.float32)
    save_file(decoded, str(GOLDEN / "decoded.safetensors"))


if __name__ == "__main__":
    GOLDEN.mkdir(parents=True, exist_ok=True)
    feature_goldens()
    decode_goldens()
    for p in sorted(list(GOLDEN.rglob("*")) + list(DATA.iterdir())):
        if p.is_file():
            print(f"{p.relative_to(REPO)}: {p.stat().st_size} bytes")
