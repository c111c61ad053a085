"""A fixture model's transformers config, and the config.json and generation_config.json written beside its weights
as Google's releases write them."""
import json
from pathlib import Path

from gemma4_fixture_specs import family_of

import transformers


def build_config(spec):
    text_cls, config_cls, _ = family_of(spec)
    text = text_cls(**spec["text"])
    config = config_cls(text_config=text, vision_config=None, audio_config=None)
    config.eos_token_id = spec["top_eos"]
    return config


def google_style_config(spec, saved):
    """config.json as Google's releases (transformers 5.5-era) write it.

    transformers 5.23 serializes full-attention layers as `per_layer_config: {"2": {"head_dim": 32}, ...}` and drops
    `global_head_dim` / `num_global_key_value_heads`; Google's files (and qatserve's parser) carry those two fields
    instead. 5.23 reads them back (Gemma4TextConfig.__post_init__ pops them into per_layer_config), which
    verify_config() checks.
    """
    t = dict(saved["text_config"])
    t.pop("per_layer_config", None)
    t["global_head_dim"] = spec["text"]["global_head_dim"]
    t["num_global_key_value_heads"] = spec["text"].get("num_global_key_value_heads")
    t["dtype"] = "bfloat16"
    top = {k: v for k, v in saved.items() if k != "text_config"}
    if spec.get("family") == "gemma4_unified":
        # Google's 12B text_config still carries the per-layer-embedding and MoE fields, as 0 / false / null.
        t.update(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0, enable_moe_block=False,
                 num_experts=None, top_k_experts=None, moe_intermediate_size=None)
        top.update(architectures=["Gemma4UnifiedForConditionalGeneration"])
    else:
        t["expert_intermediate_size"] = None   # present (null) in Google's text_config; unused by transformers
        top.update(architectures=["Gemma4ForConditionalGeneration"], eoa_token_id=258883,
                   vision_soft_tokens_per_image=280)
    text = {k: t[k] for k in sorted(t)}
    top.update(text_config=text, dtype="bfloat16", eos_token_id=spec["top_eos"],
               transformers_version=transformers.__version__)
    return {k: top[k] for k in sorted(top)}


def generation_config(spec):
    g = dict(spec["gen"], do_sample=True, temperature=1.0, top_k=64, top_p=0.95,
             transformers_version=transformers.__version__)
    return {k: g[k] for k in sorted(g)}


def write_json(path, obj):
    Path(path).write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")
