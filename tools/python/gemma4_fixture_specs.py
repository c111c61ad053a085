"""The tiny Gemma 4 models of tests/fixtures/ (MODELS), the distributions their weights are drawn from, which Linear
weights Google's w4a16 export quantizes, and the transformers classes of each model family.

Every module of the generator imports this one before torch and transformers: it sets their environment before they
load (no tqdm progress bars, no tokenizers fork warning) and quiets transformers' warnings.
"""
import os
import warnings
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    Gemma4Config,
    Gemma4ForConditionalGeneration,
    Gemma4TextConfig,
    Gemma4UnifiedConfig,
    Gemma4UnifiedForConditionalGeneration,
    Gemma4UnifiedTextConfig,
)

warnings.filterwarnings("ignore", message="You passed `quantization_config`")
transformers.logging.set_verbosity_error()

REPO = Path(__file__).resolve().parents[2]
GROUP = 32                  # QAT group: 32 consecutive input columns share one step
GREEDY_TOKENS = 32
BASE_SEED = 20260801
S, F = "sliding_attention", "full_attention"
PREFIX = "model.language_model."
ATTN, EXPERTS = "eager", "eager"   # the modeling file's own attention and expert loops

# Weight distributions (all values are rounded to bf16 before use). Chosen so that the tiny models are not chaotic:
# a 1-ulp change of one weight moves the logits by ~1e-3 or less (measured and recorded in meta.json).
EMBED_STD = 0.5             # embed_tokens: tied LM head, so logit std ~ EMBED_STD * sqrt(hidden) * final norm
PLE_EMBED_STD = 0.2         # embed_tokens_per_layer (scaled by sqrt(hidden_size_per_layer_input) in the model)
LINEAR_GAIN = 1.0           # quantized / plain Linear weights: std = LINEAR_GAIN / sqrt(in_features)
ROUTER_GAIN = 12.0          # router.proj: its input is RMSNorm(x) * scale * hidden**-0.5, i.e. rms ~ 1/sqrt(hidden)
NORM_RANGE = (0.6, 1.4)     # RMSNorm weights (Gemma 4 multiplies by w itself, not 1 + w)
QK_NORM_RANGE = (0.25, 0.5)   # q_norm / k_norm: attention scaling is 1.0, so these set the attention temperature
LAYER_SCALAR_RANGE = (0.3, 1.0)
ROUTER_SCALE_RANGE = (0.5, 1.5)
PER_EXPERT_SCALE_RANGE = (0.5, 1.5)

MODELS = {
    # E2B-like: per-layer embeddings, KV sharing of both layer types, double-wide MLP on shared layers, softcap.
    "e2b_like": dict(
        text=dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=8, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, global_head_dim=32, layer_types=[S, S, F, S, S, F, S, F],
                  num_kv_shared_layers=4, hidden_size_per_layer_input=32, vocab_size_per_layer_input=512,
                  use_double_wide_mlp=True, sliding_window=8, final_logit_softcapping=30.0,
                  pad_token_id=0, bos_token_id=2, eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=3 * 8 + 5),
    # 26B-A4B-like: MoE block (8 experts, top-2) beside the dense MLP, attention_k_eq_v with 1 global KV head vs 2.
    "moe_like": dict(
        text=dict(vocab_size=384, hidden_size=64, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, num_global_key_value_heads=1, head_dim=16, global_head_dim=32,
                  attention_k_eq_v=True, layer_types=[S, S, F, S, S, F], hidden_size_per_layer_input=0,
                  vocab_size_per_layer_input=384, enable_moe_block=True, num_experts=8, top_k_experts=2,
                  moe_intermediate_size=32, sliding_window=8, final_logit_softcapping=30.0,
                  use_bidirectional_attention="vision", pad_token_id=0, bos_token_id=2, eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=3 * 8 + 5),
    # transformers' own tiny test config (tests/models/gemma4 Gemma4TextModelTester), as is: bos 1 / eos 2,
    # window 512 > T, no softcap. Most dims are not multiples of 32; those weights stay plain bf16.
    "hf_test_defaults": dict(
        text=dict(vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
                  intermediate_size=37, head_dim=16, global_head_dim=16, max_position_embeddings=512,
                  initializer_range=0.02, pad_token_id=0, bos_token_id=1, eos_token_id=2, layer_types=[S, F, S, F],
                  num_kv_shared_layers=2, vocab_size_per_layer_input=99, hidden_size_per_layer_input=16,
                  enable_moe_block=True, num_experts=8, moe_intermediate_size=16, top_k_experts=2,
                  use_bidirectional_attention="vision"),
        top_eos=2, gen=dict(bos_token_id=1, pad_token_id=0, eos_token_id=2),
        prompt_len=20),
    # The 12B (gemma4_unified, transformers' models/gemma4_unified/) scaled down from Google's config
    # (../shared/configs/gemma-4-12B-it-qat-w4a16-ct.json): 5 sliding : 1 full layers, the last full; full layers
    # with twice the head dim, one KV head and attention_k_eq_v (no v_proj); no per-layer embeddings, no MoE, no KV
    # sharing; tied embedding; softcap 30; image tokens bidirectional on sliding layers ("vision", its default).
    "unified_like": dict(
        family="gemma4_unified",
        text=dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                  num_key_value_heads=2, num_global_key_value_heads=1, head_dim=16, global_head_dim=32,
                  attention_k_eq_v=True, layer_types=[S, S, S, S, S, F], sliding_window=8,
                  final_logit_softcapping=30.0, use_bidirectional_attention="vision", pad_token_id=0, bos_token_id=2,
                  eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=3 * 8 + 5),
    # For exactness at 128K positions (tools/python/make_long_goldens.py --deep): E2B's features (PLE, KV sharing of
    # both layer types, proportional RoPE on full layers) in the least attention work a full layer can cost, one
    # query head, since a 131,072-position prefill's attention grows with the square of its length.
    "long_like": dict(
        text=dict(vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=1,
                  num_key_value_heads=1, head_dim=16, global_head_dim=32, layer_types=[S, F, S, F],
                  num_kv_shared_layers=2, hidden_size_per_layer_input=16, vocab_size_per_layer_input=256,
                  sliding_window=8, final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=3 * 8 + 5),
    # The tied embedding on the QAT grid, as QAT exports' is, so that qatserve reads its LM head as int4 (the other
    # fixtures' embeddings are plain random bf16, which keeps their head bf16). Small and dense.
    "qat_head": dict(
        text=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=1, head_dim=16, global_head_dim=32, layer_types=[S, S, F],
                  hidden_size_per_layer_input=0, vocab_size_per_layer_input=256, sliding_window=8,
                  final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1),
        top_eos=[1, 106], gen=dict(bos_token_id=2, pad_token_id=0, eos_token_id=[1, 106, 50]),
        prompt_len=2 * 8 + 5, embedding_on_grid=True),
}

# Linear weights that Google's w4a16 export quantizes (when their input dim is a multiple of 32).
QUANT_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj", "per_layer_input_gate", "per_layer_projection",
                 "per_layer_model_projection")
FUSED_EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


# transformers classes per model family (the spec's "family"; gemma4 when absent).
FAMILIES = {
    "gemma4": (Gemma4TextConfig, Gemma4Config, Gemma4ForConditionalGeneration),
    "gemma4_unified": (Gemma4UnifiedTextConfig, Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration),
}


def family_of(spec):
    return FAMILIES[spec.get("family", "gemma4")]
