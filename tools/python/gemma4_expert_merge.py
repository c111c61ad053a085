"""The one patch our Python checks apply to transformers 5.23 to load per-expert Gemma 4 MoE checkpoints.

transformers 5.23 has no Gemma 4 entry in its checkpoint conversion mapping, so per-expert modules
`experts.{e}.{gate,up,down}_proj` (the compressed-tensors layout vLLM and SGLang read, reference §5.2) are not
merged into Gemma4TextExperts' fused params: an unpatched load leaves every expert missing (randomly initialised)
and reports the per-expert tensors as unexpected, without an error (check_transformers_load.py --unpatched
asserts exactly that). This registers the merge transformers ships for qwen2_moe (gate rows first), for the
duration of a `with` block only: save_pretrained applies registered mappings in reverse, which would split
fused experts on save.
"""
import contextlib

from transformers import conversion_mapping
from transformers.core_model_loading import Concatenate, MergeModulelist, WeightConverter

MODEL_TYPE = "gemma4_text"


@contextlib.contextmanager
def per_expert_merge_mapping():
    if conversion_mapping.get_checkpoint_conversion_mapping(MODEL_TYPE) is not None:
        yield  # transformers (or an outer block) already maps Gemma 4 experts
        return
    conversion_mapping.register_checkpoint_conversion_mapping(MODEL_TYPE, [
        WeightConverter(source_patterns=["experts.*.gate_proj.weight", "experts.*.up_proj.weight"],
                        target_patterns="experts.gate_up_proj",
                        operations=[MergeModulelist(dim=0), Concatenate(dim=1)]),
        WeightConverter(source_patterns="experts.*.down_proj.weight", target_patterns="experts.down_proj",
                        operations=[MergeModulelist(dim=0)]),
    ])
    try:
        yield
    finally:
        conversion_mapping._checkpoint_conversion_mapping_cache.pop(MODEL_TYPE, None)
        conversion_mapping.USER_REGISTERED_MAPPINGS.discard(MODEL_TYPE)


def per_expert_tensors(name, t):
    """{name: tensor} of a checkpoint tensor in the per-expert layout: fused experts [E, 2I, H] (gate_up_proj) and
    [E, H, I] (down_proj) become each expert's Linear weights (gate = the first I rows, HF's chunk order); any other
    tensor is itself."""
    if name.endswith(".experts.gate_up_proj"):
        base, inter = name[: -len("gate_up_proj")], t.shape[1] // 2
        out = {}
        for e in range(t.shape[0]):
            out[f"{base}{e}.gate_proj.weight"] = t[e, :inter]
            out[f"{base}{e}.up_proj.weight"] = t[e, inter:]
        return out
    if name.endswith(".experts.down_proj"):
        return {f"{name[: -len('down_proj')]}{e}.down_proj.weight": t[e] for e in range(t.shape[0])}
    return {name: t}
