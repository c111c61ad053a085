#!/usr/bin/env python3
"""make_unified_mm_fixtures.py: external reference fixture for the 12B's (gemma4_unified) encoder-free image and
audio embedders and their soft tokens in the text model (their parity tests' references), made with Hugging Face
transformers (pinned 5.23.0, CPU, one thread) and torchvision 0.29 (Gemma4UnifiedImageProcessor is a torchvision
backend).
Writes tests/fixtures/mm_unified_like/:
  bf16/, w4a16/          a tiny random Gemma4UnifiedForConditionalGeneration with Google's 12B structure scaled
                         down (the unified_like text model of make_gemma4_fixtures.py, an image embedder of 12-pixel
                         merged patches, 3 x 3 patches of 4 pixels, and the 640-sample audio embedder), as Google's two QAT
                         exports store it: text Linears on the QAT grid and packed in w4a16/, the embedders' weights
                         bf16 in both (on `ignore`, as Google's list has patch_dense and the embedding projections).
                         Each directory also holds the tokenizer of make_multimodal_fixtures.py, the real chat
                         template and the Gemma4UnifiedProcessor's files (AutoProcessor loads the directory).
  media/                 the inputs: PNG images of odd sizes, a 16-bit WAV clip (as make_multimodal_fixtures.py).
  reference.safetensors  as make_multimodal_fixtures.py's: per image image.<name>.pixel_values (U8: the processor's
                         values x 255) / .position_ids; per case <case>.input_ids, .mm_token_type_ids,
                         .logits_rows, .logits_f32, .logits_bf16, .greedy_f32, .image_features_f32/_bf16,
                         .input_features (+_mask), .audio_features_f32/_bf16.
  meta.json              config summary, per-case statistics, and how far transformers' other mask (the one its
                         static-cache generate builds: full layers causal, image blocks cut by the window) is from the
                         forward pass's logits.

Usage (from the repository root):
  .venv/bin/python tools/python/make_unified_mm_fixtures.py

check_multimodal_cli.py (ctest unified_multimodal_cli) runs qatserve on it.
"""
import copy
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gemma4_fixture_specs as g4_specs  # noqa: E402
import gemma4_fixture_config as g4_config  # noqa: E402
import gemma4_fixture_run as g4_run  # noqa: E402
import gemma4_fixture_w4a16 as g4_w4a16  # noqa: E402
import gemma4_fixture_weights as g4_weights  # noqa: E402
import make_multimodal_fixtures as mm  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoProcessor,
    Gemma4UnifiedAudioConfig,
    Gemma4UnifiedConfig,
    Gemma4UnifiedForConditionalGeneration,
    Gemma4UnifiedTextConfig,
    Gemma4UnifiedVisionConfig,
)
from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import (  # noqa: E402
    Gemma4UnifiedAudioFeatureExtractor,
)
from transformers.models.gemma4_unified.image_processing_gemma4_unified import (  # noqa: E402
    Gemma4UnifiedImageProcessor,
)
from transformers.models.gemma4_unified.processing_gemma4_unified import Gemma4UnifiedProcessor  # noqa: E402
from transformers.models.gemma4_unified.video_processing_gemma4_unified import (  # noqa: E402
    Gemma4UnifiedVideoProcessor,
)

NAME = "mm_unified_like"
TEXT = dict(g4_specs.MODELS["unified_like"]["text"], vocab_size=mm.VOCAB)
VISION = dict(patch_size=4, pooling_kernel_size=3, mm_embed_dim=64, output_proj_dims=64, mm_posemb_size=64,
              rms_norm_eps=1e-6)
AUDIO = dict(audio_embed_dim=640, rms_norm_eps=1e-6)
SPEC = dict(family="gemma4_unified", text=TEXT, vision=VISION, audio=AUDIO, max_soft_tokens=70, top_eos=[1, 6],
            gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 6]))
MM_IDS = dict(mm.MM_IDS)
MM_IDS["eoa_token_index"] = MM_IDS.pop("eoa_token_id")
# Google's 12B ignore list keeps these embedder Linears bf16 (patch_dense, both embedding projections): their names
# in the model, and on disk (transformers' save_pretrained writes model.vision_embedder.* and
# model.embed_vision.embedding_projection, as Google's files do, and renames them back on load).
EMBEDDER_LINEARS = ("model.embed_vision.patch_dense.weight",
                    "model.embed_vision.multimodal_embedder.embedding_projection.weight",
                    "model.embed_audio.embedding_projection.weight")
EMBEDDER_LINEARS_ON_DISK = ("model.vision_embedder.patch_dense.weight", "model.embed_vision.embedding_projection.weight",
                            "model.embed_audio.embedding_projection.weight")


def build_processor(model_dir):
    """Gemma4UnifiedProcessor saved into model_dir, then loaded back with AutoProcessor (what the checks use)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    v = VISION
    image_processor = Gemma4UnifiedImageProcessor(patch_size=v["patch_size"], max_soft_tokens=SPEC["max_soft_tokens"],
                                                  pooling_kernel_size=v["pooling_kernel_size"])
    video_processor = Gemma4UnifiedVideoProcessor(patch_size=v["patch_size"], max_soft_tokens=SPEC["max_soft_tokens"],
                                                  pooling_kernel_size=v["pooling_kernel_size"])
    processor = Gemma4UnifiedProcessor(feature_extractor=Gemma4UnifiedAudioFeatureExtractor(),
                                       image_processor=image_processor, tokenizer=tokenizer,
                                       video_processor=video_processor,
                                       chat_template=(model_dir / "chat_template.jinja").read_text(),
                                       image_seq_length=SPEC["max_soft_tokens"])
    processor.save_pretrained(model_dir)
    return AutoProcessor.from_pretrained(model_dir)


def build_config():
    text = Gemma4UnifiedTextConfig(**TEXT)
    config = Gemma4UnifiedConfig(text_config=text, vision_config=Gemma4UnifiedVisionConfig(**VISION),
                                 audio_config=Gemma4UnifiedAudioConfig(**AUDIO), **MM_IDS)
    config.eos_token_id = SPEC["top_eos"]
    return config


def fill_embedders(model, seed):
    """Seeded bf16-exact embedder weights: Linears std 1/sqrt(in), LayerNorm weights in g4_specs.NORM_RANGE and biases
    around 0, the position table std 0.3."""
    gen = torch.Generator().manual_seed(seed)
    for name, t in sorted(model.named_parameters()):
        if "language_model" in name:
            continue
        shape = tuple(t.shape)
        if name in EMBEDDER_LINEARS:
            value = g4_weights.normal(gen, shape, g4_specs.LINEAR_GAIN / shape[-1] ** 0.5)
        elif name.endswith("pos_embedding"):
            value = g4_weights.normal(gen, shape, 0.3)
        elif name.endswith(".weight"):
            value = g4_weights.uniform(gen, shape, *g4_specs.NORM_RANGE)
        else:  # LayerNorm and patch_dense biases
            value = g4_weights.normal(gen, shape, 0.1)
        with torch.no_grad():
            t.copy_(value)


def model_inputs(inputs):
    return {k: v for k, v in inputs.items() if k not in ("attention_mask", "num_soft_tokens_per_image")}


@torch.no_grad()
def run_case(model, inputs):
    m = model.model
    out = {"logits": model(**model_inputs(inputs), use_cache=False).logits[0].float()}
    if "pixel_values" in inputs:
        feats = m.get_image_features(inputs["pixel_values"], inputs["image_position_ids"])
        out["image_features"] = torch.cat(feats.pooler_output, 0)
    if "input_features" in inputs:
        a = m.get_audio_features(inputs["input_features"], inputs["input_features_mask"])
        out["audio_features"] = a.pooler_output[a.attention_mask]
    return out


@torch.no_grad()
def static_cache_mask_logits(model, inputs):
    """The logits under the mask transformers builds for a compileable cache in generate (the model class's
    create_masks_for_generate: full layers causal, sliding layers AND(window, OR(causal, block)))."""
    T = inputs["input_ids"].shape[1]
    masks = model.create_masks_for_generate(
        config=model.config, inputs_embeds=torch.empty((1, T, 0), dtype=model.dtype),
        attention_mask=inputs["attention_mask"], past_key_values=None, position_ids=torch.arange(T)[None],
        mm_token_type_ids=inputs["mm_token_type_ids"])
    args = model_inputs(inputs)
    return model(**args, attention_mask=masks, use_cache=False).logits[0].float()


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(g4_weights.seed_for(NAME, "torch"))
    out = g4_specs.REPO / "tests" / "fixtures" / NAME
    if out.exists():
        shutil.rmtree(out)
    bf16_dir, w4_dir = out / "bf16", out / "w4a16"
    bf16_dir.mkdir(parents=True)
    images, audio = mm.write_media(out / "media")
    mm.write_tokenizer(bf16_dir)
    tok_config = json.loads((bf16_dir / "tokenizer_config.json").read_text())
    g4_config.write_json(bf16_dir / "tokenizer_config.json", dict(tok_config, processor_class="Gemma4UnifiedProcessor"))
    processor = build_processor(bf16_dir)
    conversations = mm.cases(images, audio, True)
    inputs = {c: mm.processor_inputs(processor, msgs, images, audio) for c, msgs in conversations.items()}

    model = Gemma4UnifiedForConditionalGeneration(build_config()).eval()
    model.set_attn_implementation(g4_specs.ATTN)
    seed = g4_weights.seed_for(NAME)
    _, text_grids = g4_weights.fill_weights(model.model.language_model, seed)
    grids = {"model.language_model." + k: v for k, v in text_grids.items()}
    fill_embedders(model, seed + 1)

    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(bf16_dir, safe_serialization=True)
    saved = json.loads((bf16_dir / "config.json").read_text())
    config = g4_config.google_style_config(SPEC, saved)
    g4_config.write_json(bf16_dir / "config.json", dict(sorted(config.items())))
    g4_config.write_json(bf16_dir / "generation_config.json", g4_config.generation_config(SPEC))

    f32 = g4_run.load_model(bf16_dir, torch.float32)
    bf = g4_run.load_model(bf16_dir, torch.bfloat16)
    ref, case_meta = {}, {}
    for case, (text, inp) in inputs.items():
        r32, r16 = run_case(f32, inp), run_case(bf, inp)
        mm_types = inp["mm_token_type_ids"][0]
        rows = mm.kept_rows(mm_types)
        ref[f"{case}.input_ids"] = inp["input_ids"][0].to(torch.int32)
        ref[f"{case}.mm_token_type_ids"] = mm_types.to(torch.int32)
        ref[f"{case}.logits_rows"] = rows.to(torch.int32)
        ref[f"{case}.logits_f32"] = r32["logits"][rows]
        ref[f"{case}.logits_bf16"] = r16["logits"][rows].to(torch.bfloat16)
        ref[f"{case}.greedy_f32"], greedy_gap = mm.greedy(f32, inp, SPEC)
        names = [p["name"] for m in conversations[case] for p in m["content"] if p["type"] == "image"]
        for i, image in enumerate(names):
            levels = (inp["pixel_values"][i] * 255).round().to(torch.uint8)
            assert torch.equal(levels * (1 / 255), inp["pixel_values"][i]), "pixel values are not uint8 x 1/255"
            ref[f"image.{image}.pixel_values"] = levels
            ref[f"image.{image}.position_ids"] = inp["image_position_ids"][i].to(torch.int32)
        if "pixel_values" in inp:
            ref[f"{case}.image_features_f32"] = r32["image_features"].float()
            ref[f"{case}.image_features_bf16"] = r16["image_features"].to(torch.bfloat16)
        if "input_features" in inp:
            ref[f"{case}.input_features"] = inp["input_features"].float()
            ref[f"{case}.input_features_mask"] = inp["input_features_mask"].to(torch.uint8)
            ref[f"{case}.audio_features_f32"] = r32["audio_features"].float()
            ref[f"{case}.audio_features_bf16"] = r16["audio_features"].to(torch.bfloat16)
        other_mask = float((static_cache_mask_logits(f32, inp) - r32["logits"]).abs().max())
        top2 = r32["logits"][rows].topk(2, -1).values
        case_meta[case] = dict(
            prompt=text, images=names, tokens=int(mm_types.numel()), image_tokens=int((mm_types == 1).sum()),
            audio_tokens=int((mm_types == 3).sum()), logits_rows=int(rows.numel()),
            max_abs_logit_f32=float(r32["logits"].abs().max()),
            max_abs_diff_bf16_vs_f32=float((r16["logits"] - r32["logits"]).abs().max()),
            max_abs_diff_static_cache_mask=other_mask,
            top2_gap_f32_min=float((top2[:, 0] - top2[:, 1]).min()), greedy_top2_gap_f32_min=greedy_gap,
            greedy=ref[f"{case}.greedy_f32"].tolist())
        print(f"  {case}: T={mm_types.numel()} image={case_meta[case]['image_tokens']} audio="
              f"{case_meta[case]['audio_tokens']} max|logit|={case_meta[case]['max_abs_logit_f32']:.3g} "
              f"bf16-f32={case_meta[case]['max_abs_diff_bf16_vs_f32']:.3g} other mask={other_mask:.3g} "
              f"gap={case_meta[case]['top2_gap_f32_min']:.3g} greedy gap={greedy_gap:.3g}")
    save_file({k: v.contiguous() for k, v in sorted(ref.items())}, out / "reference.safetensors",
              metadata={"format": "pt"})

    w4_summary = g4_w4a16.write_w4a16(bf16_dir, w4_dir, grids, linears=set(EMBEDDER_LINEARS_ON_DISK))
    for f in bf16_dir.iterdir():
        if f.suffix in (".json", ".jinja") and f.name not in ("config.json", "generation_config.json"):
            shutil.copy(f, w4_dir / f.name)
    w4 = g4_run.load_model(w4_dir, torch.float32,
                       quantization_config=transformers.CompressedTensorsConfig(dequantize=True))
    w4_state, f32_state = w4.state_dict(), f32.state_dict()
    if any(not torch.equal(w4_state[k], v) for k, v in f32_state.items()):
        raise SystemExit("w4a16/ dequantized by transformers holds other weights than bf16/")
    for case, (_, inp) in inputs.items():
        if not torch.equal(run_case(w4, inp)["logits"][ref[f"{case}.logits_rows"].long()], ref[f"{case}.logits_f32"]):
            raise SystemExit(f"{case}: w4a16/ loaded by transformers gives other logits than bf16/")

    meta = dict(name=NAME, config=dict(text=TEXT, vision=VISION, audio=AUDIO, max_soft_tokens=SPEC["max_soft_tokens"],
                                       **MM_IDS),
                cases=case_meta, w4a16=w4_summary,
                versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                              torchvision=__import__("torchvision").__version__),
                generator="tools/python/make_unified_mm_fixtures.py")
    g4_config.write_json(out / "meta.json", meta)
    print("fixture written:", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
