"""Reading a checkpoint directory (all its *.safetensors shards) with the safetensors library."""
from pathlib import Path

from safetensors import safe_open


def load_safetensors(directory):
    """Every tensor of every shard in the directory, as torch tensors keyed by name."""
    tensors = {}
    for shard in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(shard, framework="pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})
    return tensors
