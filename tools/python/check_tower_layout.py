"""The full-size towers `qatserve synth` writes against the modules transformers builds from the same configs.

For each preset (e2b: vision and audio; 26b-a4b: vision), `synth --towers-only --format bf16` writes the towers;
transformers' Gemma4VisionModel / Gemma4AudioModel are built from the preset's config on the meta device (no
memory, no weights) and their state_dict keys (under model.vision_tower. / model.audio_tower.) and shapes, with the
embedders' projections, must equal the file's tower tensors exactly. Usage: check_tower_layout.py QATSERVE WORKDIR.
"""
import json
import struct
import subprocess
import sys
from pathlib import Path

import torch
from transformers import Gemma4Config
from transformers.models.gemma4 import modeling_gemma4

PRESETS = {"e2b": ("vision", "audio"), "26b-a4b": ("vision",)}


def expected(config, tower):
    sub = getattr(config, f"{tower}_config")
    with torch.device("meta"):
        module = (modeling_gemma4.Gemma4VisionModel if tower == "vision" else modeling_gemma4.Gemma4AudioModel)(sub)
    keys = {f"model.{tower}_tower.{k}": tuple(t.shape) for k, t in module.state_dict().items()}
    width = sub.hidden_size if tower == "vision" else sub.output_proj_dims
    keys[f"model.embed_{tower}.embedding_projection.weight"] = (config.text_config.hidden_size, width)
    return keys


def stored(path):
    with open(path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    header.pop("__metadata__", None)
    return {k: tuple(v["shape"]) for k, v in header.items()}


def main():
    qatserve, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    failures = 0
    for preset, towers in PRESETS.items():
        out = work / f"towers-{preset}"
        subprocess.run([qatserve, "synth", "--preset", preset, "--format", "bf16", "--towers-only", "--quiet",
                        "--out", str(out)], check=True)
        config = Gemma4Config.from_dict(json.loads((out / "config.json").read_text()))
        have = stored(out / "model.safetensors")
        for tower in towers:
            want = expected(config, tower)
            mine = {k: v for k, v in have.items() if k.startswith((f"model.{tower}_tower.", f"model.embed_{tower}."))}
            missing, extra = sorted(set(want) - set(mine)), sorted(set(mine) - set(want))
            shapes = [(k, mine[k], want[k]) for k in want if k in mine and mine[k] != want[k]]
            ok = not (missing or extra or shapes)
            failures += not ok
            print(f"{preset} {tower}: {len(mine)} tensors, transformers {len(want)}: "
                  f"{'OK' if ok else f'missing {missing[:3]} extra {extra[:3]} shapes {shapes[:3]}'}")
        for f in out.iterdir():
            f.unlink()
        out.rmdir()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
