#!/usr/bin/env python3
"""check_audio_external.py AUDIO_PROBE: qatserve's audio path (src/media through tests/media/audio_probe) against
transformers, live:

- features: Gemma4AudioFeatureExtractor on the test signals, on random clips of random lengths (0 to 5 s), on a 33 s
  clip (cut at 30 s), and with the option variants read from processor_config.json by transformers itself
  (from_pretrained) and by qatserve (read_audio_feature_options); the mask and the soft-token count of
  Gemma4Processor must be identical, every feature within 1e-5 relative (to max(|value|, 1));
- decoding: files the `soundfile` package writes (WAV PCM16/PCM24/float, FLAC, Ogg Vorbis, Opus, MP3; mono,
  stereo and 6 channels; 8 to 48 kHz) decoded by qatserve and by transformers' `load_audio` (soundfile + soxr
  'soxr_hq'): same length, every sample within 1e-5; and a chained Ogg Vorbis stream (its first link);
- end to end: qatserve's features of a decoded file against the extractor on load_audio's waveform.
Prints one line per case and the worst error of each kind; exit 1 on any failure.
"""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

import audio_reference as ref

FEATURE_TOLERANCE = 1e-5
SAMPLE_TOLERANCE = 1e-5


class Probe:
    def __init__(self, binary, work):
        self.binary, self.work = binary, Path(work)

    def _run(self, *args):
        r = subprocess.run([self.binary, *map(str, args)], capture_output=True, text=True, timeout=300)
        if r.returncode:
            raise RuntimeError(f"audio_probe {' '.join(map(str, args))}: {r.stderr.strip()}")

    def features(self, waveform, model_dir):
        src, out = self.work / "in.f32", self.work / "out"
        np.asarray(waveform, np.float32).tofile(src)
        self._run("features", src, model_dir, out)
        info = json.loads(Path(f"{out}.json").read_text())
        features = np.fromfile(f"{out}.f32", np.float32).reshape(info["num_frames"], info["num_mel"])
        return features, np.array(info["mask"], np.uint8), info["num_soft_tokens"]

    def decode(self, path, hint):
        out = self.work / "decoded.f32"
        self._run("decode", path, hint, out)
        return np.fromfile(out, np.float32)


def relative_error(ours, expected):
    if expected.size == 0:
        return 0.0
    return float((np.abs(ours.astype(np.float64) - expected) / np.maximum(np.abs(expected), 1.0)).max())


class Checker:
    def __init__(self):
        self.failures, self.worst = [], {}

    def record(self, kind, name, ok, error, detail=""):
        self.worst[kind] = max(self.worst.get(kind, 0.0), error)
        print(f"{'ok  ' if ok else 'FAIL'} {kind:9} {name:34} {detail} error {error:.2e}")
        if not ok:
            self.failures.append(f"{kind} {name}: {detail} error {error:.2e}")

    def features(self, name, ours, expected_features, expected_mask, num_samples=None, tokens=None):
        features, mask, soft_tokens = ours
        same_shape = features.shape == expected_features.shape and np.array_equal(mask, expected_mask)
        error = relative_error(features, expected_features) if same_shape else float("inf")
        ok = same_shape and error <= FEATURE_TOLERANCE
        detail = f"{features.shape[0]:4d} frames"
        if num_samples is not None:
            from_mask, from_length = ref.hf_soft_tokens(expected_mask, num_samples)
            ok = ok and soft_tokens == from_mask == from_length
            detail += f" {soft_tokens:3d} tokens (HF {from_mask}/{from_length})"
        self.record("features", name, ok, error, detail)


def check_features(probe, check, work):
    defaults = work / "no-config"
    defaults.mkdir()
    signals = {name: ref.to_float(pcm) for name, pcm in ref.test_signals().items()}
    signals["long_33s"] = ref.to_float(np.tile(ref.long_segment(), ref.LONG_REPEATS))
    rng = np.random.default_rng(1234)
    for i in range(12):  # random lengths and levels, float32 (not only 16-bit steps)
        n = int(rng.integers(0, 5 * ref.SAMPLE_RATE))
        signals[f"random_{i}_{n}"] = (rng.uniform(1e-4, 1.0) * rng.standard_normal(n)).astype(np.float32)
    for name, x in signals.items():
        f, m = ref.hf_features(x)
        check.features(name, probe.features(x, defaults), f, m, num_samples=len(x))
    from transformers import Gemma4AudioFeatureExtractor

    sweep = signals["sweep"]
    for variant, block in ref.OPTION_VARIANTS.items():
        directory = work / variant
        directory.mkdir()
        config = {"feature_extractor": {"feature_extractor_type": "Gemma4AudioFeatureExtractor", **block}}
        (directory / "processor_config.json").write_text(json.dumps(config))
        out = Gemma4AudioFeatureExtractor.from_pretrained(directory)([sweep], return_tensors="np")
        check.features(variant, probe.features(sweep, directory), out["input_features"][0],
                       out["input_features_mask"][0].astype(np.uint8))
    return defaults


# (rate, channels, soundfile format, subtype, extension)
ENCODINGS = [
    (16000, 1, "WAV", "PCM_16", "wav"), (44100, 2, "WAV", "PCM_16", "wav"), (48000, 6, "WAV", "PCM_24", "wav"),
    (8000, 1, "WAV", "FLOAT", "wav"), (22050, 2, "WAV", "FLOAT", "wav"), (32000, 1, "FLAC", "PCM_16", "flac"),
    (96000, 2, "FLAC", "PCM_24", "flac"), (44100, 2, "OGG", "VORBIS", "ogg"), (16000, 1, "OGG", "VORBIS", "ogg"),
    (48000, 2, "OGG", "OPUS", "opus"), (24000, 1, "OGG", "OPUS", "opus"), (44100, 2, "MP3", "MPEG_LAYER_III", "mp3"),
    (16000, 1, "MP3", "MPEG_LAYER_III", "mp3"), (48000, 1, "MP3", "MPEG_LAYER_III", "mp3"),
]


def check_decoding(probe, check, work, defaults):
    rng = np.random.default_rng(99)
    for i, (rate, channels, fmt, subtype, ext) in enumerate(ENCODINGS):
        t = np.arange(int(2.0 * rate)) / rate
        data = np.stack([0.3 * np.sin(2 * np.pi * (200 + 150 * c) * t * (1 + t)) + 0.05 * rng.standard_normal(len(t))
                         for c in range(channels)], axis=1).astype(np.float32)
        path = work / f"clip{i}_{rate}_{channels}ch_{subtype.lower()}.{ext}"
        sf.write(str(path), data, rate, format=fmt, subtype=subtype)
        expected = ref.hf_load_audio(path)
        ours = probe.decode(path, ext)
        same = ours.shape == expected.shape
        error = float(np.abs(ours - expected).max()) if same else float("inf")
        check.record("decode", path.name, same and error <= SAMPLE_TOLERANCE, error, f"{len(ours):6d} samples")
        if i in (1, 7, 11):  # end to end: decoded file -> features
            f, m = ref.hf_features(expected)
            check.features(f"{path.name} (decoded)", probe.features(ours, defaults), f, m, num_samples=len(expected))
    # A chained Ogg Vorbis stream (two files' bytes one after the other, other rate and channels): load_audio reads
    # its first link only, as libsndfile does.
    chained = work / "chained_vorbis.ogg"
    chained.write_bytes(b"".join((work / name).read_bytes() for name in
                                 ("clip8_16000_1ch_vorbis.ogg", "clip7_44100_2ch_vorbis.ogg")))
    expected, ours = ref.hf_load_audio(chained), probe.decode(chained, "ogg")
    same = ours.shape == expected.shape
    error = float(np.abs(ours - expected).max()) if same else float("inf")
    check.record("decode", chained.name, same and error <= SAMPLE_TOLERANCE, error, f"{len(ours):6d} samples")


def main():
    probe_binary = sys.argv[1]
    check = Checker()
    with tempfile.TemporaryDirectory(prefix="qatserve-audio-") as tmp:
        work = Path(tmp)
        probe = Probe(probe_binary, work)
        defaults = check_features(probe, check, work)
        check_decoding(probe, check, work, defaults)
    print("worst: " + ", ".join(f"{k} {v:.2e}" for k, v in check.worst.items()))
    if check.failures:
        print(f"{len(check.failures)} FAILED:\n  " + "\n  ".join(check.failures))
        return 1
    print("audio external check: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
