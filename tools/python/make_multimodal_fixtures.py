#!/usr/bin/env python3
"""make_multimodal_fixtures.py: external reference fixtures for qatserve's vision tower, multimodal embedders and
soft tokens in the text model (their parity tests' references), made with Hugging Face transformers (pinned 5.23.0,
CPU, one thread).

Writes, per model, tests/fixtures/<name>/:
  bf16/, w4a16/          a tiny random Gemma4ForConditionalGeneration as Google's two QAT exports store it (as in
                         make_gemma4_fixtures.py); the towers' Linear weights whose input dim is a multiple of 32
                         sit on the QAT grid and are packed in w4a16/, except what Google's `ignore` list names
                         (embed_vision / embed_audio embedding_projection, lm_head). Each directory also holds a
                         small tokenizer with Gemma 4's multimodal special tokens, the real chat template and a
                         processor_config.json (Gemma4Processor: Pillow image processor, audio feature extractor).
  media/                 the inputs: PNG images of odd sizes, a 16-bit WAV clip.
  reference.safetensors  per image image.<name>.pixel_values (U8 [max_patches, 3 patch^2]: the processor's values
                         x 255, all integers) and .position_ids (I32 [max_patches, 2], -1 = padding); per case
                         <case>.*: input_ids / mm_token_type_ids (the processor's), input_features(+_mask),
                         image_features / audio_features (get_image_features / get_audio_features pooler output:
                         soft tokens in text hidden space) in f32 and bf16, logits_rows (positions kept: every
                         3rd text position, the last 8, every 8th soft token) with logits_f32 / logits_bf16 there,
                         greedy_f32 (8 tokens, transformers' generate with the KV cache). The images of a case, in
                         prompt order, are listed in meta.json (cases.<case>.images).
  meta.json              config summary, per-case shapes, logit statistics, versions.

Usage (from the repository root):
  .venv/bin/python tools/python/make_multimodal_fixtures.py [--only mm_e2b_like]

The fixtures were made before torchvision was pinned (tools/python/requirements.txt now has it, for the 12B's image
processor), so the script builds Gemma4Processor from its tokenizer, image processor and feature extractor with the
video processor left out; qatserve reads no video.
"""
import argparse
import copy
import json
import shutil
import sys
import wave
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemma4_fixture_specs as g4_specs  # noqa: E402  (the text models, weight distributions)
import gemma4_fixture_config as g4_config  # noqa: E402  (config writing)
import gemma4_fixture_run as g4_run  # noqa: E402  (loading)
import gemma4_fixture_w4a16 as g4_w4a16  # noqa: E402  (packing)
import gemma4_fixture_weights as g4_weights  # noqa: E402  (seeds, QAT grid)
from gemma4_expert_merge import per_expert_merge_mapping  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    Gemma4AudioConfig,
    Gemma4AudioFeatureExtractor,
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4ImageProcessorPil,
    Gemma4Processor,
    Gemma4TextConfig,
    Gemma4VisionConfig,
    GenerationConfig,
)

REPO = g4_specs.REPO
TEMPLATE = REPO / "tests" / "data" / "gemma4-tokenizer" / "llamacpp-models-templates-gemma4.jinja"
GREEDY_TOKENS = 8
# Logits kept (the fixtures stay small): every 3rd text position, the last 8 positions, every 8th soft token.
TEXT_STRIDE, LAST_ROWS, SOFT_TOKEN_STRIDE = 3, 8, 8
S, F = "sliding_attention", "full_attention"

# ----------------------------------------------------------------------------------------------- tokenizer
SP = "\u2581"
CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|think|>", "<|channel>",
           "<channel|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
           "<tool_response|>", '<|"|>', "<|image>", "<image|>", "<|image|>", "<|audio>", "<audio|>", "<|audio|>",
           "<|video|>"]
CHARS = ([SP, "\n"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)]
         + list("0123456789.,?!:;'\"-()[]{}<>|/_=+*&%$#@`~\\^"))
FIRST_BYTE = 128
VOCAB = FIRST_BYTE + 256
NAMED_TOKENS = {
    "sot_token": "<|turn>", "eot_token": "<turn|>", "soc_token": "<|channel>", "eoc_token": "<channel|>",
    "think_token": "<|think|>", "escape_token": '<|"|>', "std_token": "<|tool>", "etd_token": "<tool|>",
    "stc_token": "<|tool_call>", "etc_token": "<tool_call|>", "str_token": "<|tool_response>",
    "etr_token": "<tool_response|>", "boi_token": "<|image>", "eoi_token": "<image|>", "image_token": "<|image|>",
    "boa_token": "<|audio>", "eoa_token": "<audio|>", "audio_token": "<|audio|>",
}
TOKEN_ID = {t: i for i, t in enumerate(CONTROL)}


def write_tokenizer(out):
    """A 384-id Gemma-style tokenizer: control and multimodal tokens, single characters, byte fallback."""
    vocab = {t: i for i, t in enumerate(CONTROL)}
    for c in CHARS:
        vocab[c] = len(vocab)
    while len(vocab) < FIRST_BYTE:
        vocab[f"<unused{len(vocab)}>"] = len(vocab)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", SP)
    tok.decoder = decoders.Sequence([decoders.Replace(SP, " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL])
    tok.save(str(out / "tokenizer.json"))
    config = {"add_bos_token": False, "add_eos_token": False, "backend": "tokenizers", "bos_token": "<bos>",
              "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>",
              **NAMED_TOKENS, "model_specific_special_tokens": NAMED_TOKENS, "extra_special_tokens": ["<|video|>"],
              "padding_side": "left", "processor_class": "Gemma4Processor", "tokenizer_class": "GemmaTokenizer"}
    g4_config.write_json(out / "tokenizer_config.json", config)
    shutil.copy(TEMPLATE, out / "chat_template.jinja")


def build_processor(model_dir, spec):
    """Gemma4Processor from the directory's tokenizer and the spec's image processor / feature extractor (the
    video processor needs torchvision: left out, see the module docstring). Also writes processor_config.json."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    v = spec["vision"]
    image_processor = Gemma4ImageProcessorPil(patch_size=v["patch_size"], max_soft_tokens=spec["max_soft_tokens"],
                                              pooling_kernel_size=v["pooling_kernel_size"])
    feature_extractor = Gemma4AudioFeatureExtractor()
    check = Gemma4Processor.check_argument_for_proper_class

    def without_video(self, name, arg):
        return None if name == "video_processor" and arg is None else check(self, name, arg)

    Gemma4Processor.check_argument_for_proper_class = without_video
    try:
        processor = Gemma4Processor(feature_extractor=feature_extractor, image_processor=image_processor,
                                    tokenizer=tokenizer, video_processor=None,
                                    chat_template=(model_dir / "chat_template.jinja").read_text(),
                                    image_seq_length=spec["max_soft_tokens"])
    finally:
        Gemma4Processor.check_argument_for_proper_class = check
    config = {"processor_class": "Gemma4Processor", "image_seq_length": spec["max_soft_tokens"],
              "audio_seq_length": 750, "audio_ms_per_token": 40, "image_processor": image_processor.to_dict(),
              "feature_extractor": feature_extractor.to_dict()}
    (model_dir / "processor_config.json").write_text(json.dumps(config, indent=2, default=lambda v: v.tolist() if isinstance(v, np.ndarray) else str(v)) + "\n")
    return processor


# ----------------------------------------------------------------------------------------------- models
VISION_BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=32, patch_size=8, pooling_kernel_size=3,
                   position_embedding_size=128, rms_norm_eps=1e-6)
MODELS = {
    # Vision (clipped linears, no standardize: as E2B) and audio towers on the E2B-like text model (PLE, KV sharing).
    "mm_e2b_like": dict(
        text=dict(g4_specs.MODELS["e2b_like"]["text"], vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB),
        vision=dict(VISION_BASE, use_clipped_linears=True, standardize=False),
        # subsampling_conv_channels[0] must be 128 (the mel bins): transformers sizes input_proj_linear from it.
        audio=dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=2, subsampling_conv_channels=[128, 8],
                   output_proj_dims=96, conv_kernel_size=5, attention_chunk_size=12, attention_context_left=13,
                   attention_context_right=0, use_clipped_linears=True, rms_norm_eps=1e-6),
        max_soft_tokens=70, top_eos=[1, 6], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 6])),
    # Vision (standardize, plain linears) on the 26B-like MoE text model with bidirectional vision attention.
    "mm_moe_like": dict(
        text=dict(g4_specs.MODELS["moe_like"]["text"], vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB),
        vision=dict(VISION_BASE, use_clipped_linears=False, standardize=True),
        audio=None,
        max_soft_tokens=70, top_eos=[1, 6], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 6])),
}
MM_IDS = dict(boi_token_id=TOKEN_ID["<|image>"], eoi_token_id=TOKEN_ID["<image|>"],
              image_token_id=TOKEN_ID["<|image|>"], boa_token_id=TOKEN_ID["<|audio>"],
              eoa_token_id=TOKEN_ID["<audio|>"], audio_token_id=TOKEN_ID["<|audio|>"],
              video_token_id=TOKEN_ID["<|video|>"])
# Google's -qat-w4a16-ct ignore list names these tower modules (the embedders' projections): kept bf16.
GOOGLE_IGNORED = ("embed_vision.embedding_projection", "embed_audio.embedding_projection")


def build_config(spec):
    text = Gemma4TextConfig(**spec["text"])
    vision = Gemma4VisionConfig(**spec["vision"])
    audio = Gemma4AudioConfig(**spec["audio"]) if spec["audio"] else None
    config = Gemma4Config(text_config=text, vision_config=vision, audio_config=audio, **MM_IDS)
    config.eos_token_id = spec["top_eos"]
    return config


def tower_linears(model):
    """Full weight names of the towers' and embedders' nn.Linear modules."""
    return {f"{n}.weight" for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and "language_model" not in n}


def fill_towers(model, seed):
    """Seeded bf16-exact tower and embedder weights: Linears with input dims a multiple of 32 on the QAT grid (but
    the ones Google's ignore list names), norms in g4_specs.NORM_RANGE, everything else transformers' init rounded to
    bf16. Returns {grid weight name: (levels, step)}."""
    gen = torch.Generator().manual_seed(seed)
    grids, linears = {}, tower_linears(model)
    named = dict(model.named_parameters())
    named.update({n: b for n, b in model.named_buffers() if n.endswith(("std_bias", "std_scale"))})
    for name in sorted(n for n in named if "language_model" not in n):
        t, shape = named[name], tuple(named[name].shape)
        if name in linears:
            std = g4_specs.LINEAR_GAIN / shape[-1] ** 0.5
            if shape[-1] % g4_specs.GROUP == 0 and not any(i in name for i in GOOGLE_IGNORED):
                value, levels, step = g4_weights.qat_grid(gen, shape, std)
                grids[name] = (levels, step.to(torch.bfloat16))
            else:
                value = g4_weights.normal(gen, shape, std)
        elif name.endswith(("q_norm.weight", "k_norm.weight")):
            value = g4_weights.uniform(gen, shape, *g4_specs.QK_NORM_RANGE)
        elif "norm" in name and name.endswith(".weight"):
            value = g4_weights.uniform(gen, shape, *g4_specs.NORM_RANGE)
        elif name.endswith("position_embedding_table"):
            value = g4_weights.normal(gen, shape, 0.3)
        elif name.endswith("std_bias"):
            value = g4_weights.normal(gen, shape, 1.0)
        elif name.endswith("std_scale"):
            value = g4_weights.uniform(gen, shape, 0.1, 0.3)
        else:  # convolutions, biases, audio per_dim_scale: transformers' own init, on the bf16 grid
            value = g4_weights.normal(gen, shape, float(t.float().std()) if t.numel() > 1 else 0.1)
        with torch.no_grad():
            t.copy_(value)
    return grids


@torch.no_grad()
def set_clip_ranges(model, run):
    """Clipped linears get finite ranges that bite: 0.9 x the largest |input| / |output| each one sees on `run`
    (bf16 values), so that both clamps change some activations."""
    clipped = [m for m in model.modules() if type(m).__name__ == "Gemma4ClippableLinear" and m.use_clipped_linears]
    peaks, hooks = {}, []
    for m in clipped:
        def hook(module, args, out):
            a, b = peaks.get(module, (0.0, 0.0))
            peaks[module] = (max(a, float(args[0].abs().max())), max(b, float(out.abs().max())))
        hooks.append(m.register_forward_hook(hook))
    run()
    for h in hooks:
        h.remove()
    for m in clipped:
        if m not in peaks:  # a linear the run never reached keeps open ranges
            continue
        i, o = (g4_weights.bf16(torch.tensor(0.9 * p)) for p in peaks[m])
        m.input_min.fill_(-i), m.input_max.fill_(i), m.output_min.fill_(-o), m.output_max.fill_(o)
    return len(peaks)


# ----------------------------------------------------------------------------------------------- media and cases
def make_image(width, height, seed):
    """Smooth colour ramps, a bright disc and noise: features vary across patches."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 255 * x / max(width - 1, 1)
    g = 255 * (0.5 + 0.5 * np.sin(y / 5.0 + seed))
    b = np.where((x - width / 3) ** 2 + (y - height / 2) ** 2 < (min(width, height) / 4) ** 2, 230, 40)
    img = np.stack([r, g, b], -1) + rng.normal(0, 18, (height, width, 3))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def make_audio(seconds, seed):
    """A chirp plus noise, as 16-bit samples at 16 kHz (so the WAV file holds exactly what was processed)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    x = 0.4 * np.sin(2 * np.pi * (300 + 900 * t) * t) + 0.05 * rng.standard_normal(t.size)
    pcm = np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)
    return pcm, pcm.astype(np.float32) / 32768


def write_media(out):
    out.mkdir(parents=True, exist_ok=True)
    images = {"odd_45x71": make_image(45, 71, 1), "wide_97x33": make_image(97, 33, 2),
              "square_50x50": make_image(50, 50, 3)}
    for name, img in images.items():
        img.save(out / f"{name}.png")
    pcm, samples = make_audio(0.6, 4)
    with wave.open(str(out / "chirp_0.6s.wav"), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000), w.writeframes(pcm.tobytes())
    return images, {"chirp_0.6s": samples}


def cases(images, audio, with_audio):
    img, txt = (lambda n: {"type": "image", "name": n}), (lambda s: {"type": "text", "text": s})
    aud = lambda n: {"type": "audio", "name": n}  # noqa: E731
    c = {
        "image_odd": [{"role": "user", "content": [img("odd_45x71"), txt("Describe this.")]}],
        "two_images": [{"role": "user", "content": [img("wide_97x33"), img("square_50x50"), txt("Compare them.")]}],
        "multi_turn": [{"role": "user", "content": [txt("Hi!")]},
                       {"role": "assistant", "content": [txt("Hello.")]},
                       {"role": "user", "content": [img("odd_45x71"), txt("And this?")]}],
        "text_only": [{"role": "user", "content": [txt("Tell me a story.")]}],
    }
    if with_audio:
        c["audio"] = [{"role": "user", "content": [aud("chirp_0.6s"), txt("What is it?")]}]
        c["audio_image"] = [{"role": "user", "content": [img("square_50x50"), aud("chirp_0.6s"), txt("Both?")]}]
    return c


def processor_inputs(processor, messages, images, audio):
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    parts = [p for m in messages for p in m["content"]]
    imgs = [images[p["name"]] for p in parts if p["type"] == "image"] or None
    auds = [audio[p["name"]] for p in parts if p["type"] == "audio"] or None
    return text, processor(text=text, images=imgs, audio=auds, return_tensors="pt")


# ----------------------------------------------------------------------------------------------- references
def model_inputs(inputs):
    return {k: v for k, v in inputs.items() if k != "attention_mask"}


@torch.no_grad()
def run_case(model, inputs):
    m = model.model
    out = {"logits": model(**model_inputs(inputs), use_cache=False).logits[0].float()}
    if "pixel_values" in inputs:
        feats = m.get_image_features(inputs["pixel_values"].to(model.dtype), inputs["image_position_ids"])
        out["image_features"] = torch.cat(feats.pooler_output, 0)
    if "input_features" in inputs:
        a = m.get_audio_features(inputs["input_features"].to(model.dtype), inputs["input_features_mask"])
        out["audio_features"] = a.pooler_output[a.attention_mask]
    return out


@torch.no_grad()
def greedy(model, inputs, spec):
    gc = GenerationConfig(max_new_tokens=GREEDY_TOKENS, min_new_tokens=0, do_sample=False, eos_token_id=None,
                          pad_token_id=spec["gen"]["pad_token_id"], bos_token_id=spec["gen"]["bos_token_id"],
                          temperature=None, top_k=None, top_p=None)
    saved, model.generation_config = model.generation_config, gc
    try:
        out = model.generate(**inputs, generation_config=gc, use_cache=True, output_scores=True,
                             return_dict_in_generate=True)
    finally:
        model.generation_config = saved
    gaps = [float(t.topk(2, -1).values[0, 0] - t.topk(2, -1).values[0, 1]) for t in out.scores]
    return out.sequences[0, inputs["input_ids"].shape[1]:].to(torch.int32), min(gaps)


def kept_rows(mm_types):
    soft, text = (mm_types != 0).nonzero()[:, 0], (mm_types == 0).nonzero()[:, 0]
    rows = torch.cat([text[::TEXT_STRIDE], soft[::SOFT_TOKEN_STRIDE], torch.arange(mm_types.numel())[-LAST_ROWS:]])
    return rows.unique()


def make_fixture(name, spec, root):
    print(f"== {name}")
    torch.manual_seed(g4_weights.seed_for(name, "torch"))
    out = root / name
    if out.exists():
        shutil.rmtree(out)
    bf16_dir, w4_dir = out / "bf16", out / "w4a16"
    bf16_dir.mkdir(parents=True)
    images, audio = write_media(out / "media")
    write_tokenizer(bf16_dir)
    processor = build_processor(bf16_dir, spec)
    conversations = cases(images, audio, spec["audio"] is not None)
    inputs = {c: processor_inputs(processor, msgs, images, audio) for c, msgs in conversations.items()}

    model = Gemma4ForConditionalGeneration(build_config(spec)).eval()
    model.set_attn_implementation(g4_specs.ATTN)
    model.set_experts_implementation(g4_specs.EXPERTS)
    seed = g4_weights.seed_for(name)
    kinds, text_grids = g4_weights.fill_weights(model.model.language_model, seed)
    grids = {"model.language_model." + k: v for k, v in text_grids.items()}
    grids.update(fill_towers(model, seed + 1))
    clipped = set_clip_ranges(model, lambda: [run_case(model, i) for _, i in inputs.values()])

    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(bf16_dir, safe_serialization=True)
    saved = json.loads((bf16_dir / "config.json").read_text())
    config = g4_config.google_style_config(spec, saved)
    config.update(MM_IDS, eoa_token_index=MM_IDS["eoa_token_id"], vision_soft_tokens_per_image=spec["max_soft_tokens"])
    g4_config.write_json(bf16_dir / "config.json", dict(sorted(config.items())))
    g4_config.write_json(bf16_dir / "generation_config.json", g4_config.generation_config(spec))

    f32 = g4_run.load_model(bf16_dir, torch.float32)
    bf = g4_run.load_model(bf16_dir, torch.bfloat16)
    ref, case_meta = {}, {}
    for case, (text, inp) in inputs.items():
        r32, r16 = run_case(f32, inp), run_case(bf, inp)
        mm = inp["mm_token_type_ids"][0]
        rows = kept_rows(mm)
        ref[f"{case}.input_ids"] = inp["input_ids"][0].to(torch.int32)
        ref[f"{case}.mm_token_type_ids"] = mm.to(torch.int32)
        ref[f"{case}.logits_rows"] = rows.to(torch.int32)
        ref[f"{case}.logits_f32"] = r32["logits"][rows]
        ref[f"{case}.logits_bf16"] = r16["logits"][rows].to(torch.bfloat16)
        ref[f"{case}.greedy_f32"], greedy_gap = greedy(f32, inp, spec)
        names = [p["name"] for m in conversations[case] for p in m["content"] if p["type"] == "image"]
        for i, image in enumerate(names):  # each image once: image.<name>.*
            pv = inp["pixel_values"][i] * 255
            assert torch.equal(pv, pv.round()), "pixel values are not k/255"
            ref[f"image.{image}.pixel_values"] = pv.round().to(torch.uint8)
            ref[f"image.{image}.position_ids"] = inp["image_position_ids"][i].to(torch.int32)
        if "pixel_values" in inp:
            ref[f"{case}.image_features_f32"] = r32["image_features"].float()
            ref[f"{case}.image_features_bf16"] = r16["image_features"].to(torch.bfloat16)
        if "input_features" in inp:
            ref[f"{case}.input_features"] = inp["input_features"].float()
            ref[f"{case}.input_features_mask"] = inp["input_features_mask"].to(torch.uint8)
            ref[f"{case}.audio_features_f32"] = r32["audio_features"].float()
            ref[f"{case}.audio_features_bf16"] = r16["audio_features"].to(torch.bfloat16)
        top2 = r32["logits"][rows].topk(2, -1).values
        case_meta[case] = dict(
            prompt=text, images=names, tokens=int(mm.numel()), image_tokens=int((mm == 1).sum()), audio_tokens=int((mm == 3).sum()),
            logits_rows=int(rows.numel()), max_abs_logit_f32=float(r32["logits"].abs().max()),
            max_abs_diff_bf16_vs_f32=float((r16["logits"] - r32["logits"]).abs().max()),
            top2_gap_f32_min=float((top2[:, 0] - top2[:, 1]).min()), greedy_top2_gap_f32_min=greedy_gap, greedy=ref[f"{case}.greedy_f32"].tolist())
        print(f"  {case}: T={mm.numel()} image={case_meta[case]['image_tokens']} audio="
              f"{case_meta[case]['audio_tokens']} max|logit|={case_meta[case]['max_abs_logit_f32']:.3g} "
              f"bf16-f32={case_meta[case]['max_abs_diff_bf16_vs_f32']:.3g} "
              f"gap={case_meta[case]['top2_gap_f32_min']:.3g} greedy gap={greedy_gap:.3g}")
    save_file({k: v.contiguous() for k, v in sorted(ref.items())}, out / "reference.safetensors",
              metadata={"format": "pt"})

    w4_summary = g4_w4a16.write_w4a16(bf16_dir, w4_dir, grids, linears=tower_linears(model))
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json"):
        shutil.copy(bf16_dir / f, w4_dir / f)
    # The packed checkpoint, dequantized by transformers, must reproduce the bf16 one's f32 results exactly.
    with per_expert_merge_mapping():
        w4 = g4_run.load_model(w4_dir, torch.float32,
                           quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    w4_state, f32_state = w4.state_dict(), f32.state_dict()
    if any(not torch.equal(w4_state[k], v) for k, v in f32_state.items()):
        raise SystemExit(f"{name}: w4a16/ dequantized by transformers holds other weights than bf16/")
    for case, (_, inp) in inputs.items():
        got = run_case(w4, inp)
        if not torch.equal(got["logits"][ref[f"{case}.logits_rows"].long()], ref[f"{case}.logits_f32"]):
            raise SystemExit(f"{name}/{case}: w4a16/ loaded by transformers gives other logits than bf16/")

    meta = dict(name=name, config=dict(text=spec["text"], vision=spec["vision"], audio=spec["audio"],
                                       max_soft_tokens=spec["max_soft_tokens"], **MM_IDS),
                cases=case_meta, clipped_linears_with_ranges=clipped, w4a16=w4_summary,
                packed_tower_linears=sorted(n for n in grids if "language_model" not in n),
                versions=dict(torch=torch.__version__, transformers=transformers.__version__),
                generator="tools/python/make_multimodal_fixtures.py")
    g4_config.write_json(out / "meta.json", meta)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures")
    ap.add_argument("--only", nargs="*", choices=sorted(MODELS), default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name in args.only or list(MODELS):
        make_fixture(name, MODELS[name], args.out)
    print("fixtures written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
