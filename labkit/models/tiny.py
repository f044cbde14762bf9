"""A tiny MiMo-style model directory: Qwen2 trunk + MTP layers, char tokenizer, safetensors weights.

The directory has the same shape as a real MiMo checkpoint (`model_type: mimo`, `num_nextn_predict_layers`,
`model.mtp_layers.{i}.*` tensors), so every code path that takes it also takes a real HF checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from labkit.config import ModelSpec, check
from labkit.models.naming import hf_tensors
from labkit.models.tokenizer import BOS, EOS, PAD, save_char_tokenizer

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "data" / "tiny-mimo"
# The family at sync-measurement sizes. "tiny" is the shipped checkpoint (data/tiny-mimo: 43 tensors, 2.6 MB, so
# small that a sync's fixed costs hide what bucket size does); "quick" and "bench" scale it up by its size
# arguments, with random weights (a sync moves bytes, whatever they hold). "bench" is 307 tensors, 317,407,232
# bytes in fp32 (data/bench_sync_cpu.json, `labkit bench sync`).
QUICK_SPEC = ModelSpec(hidden=256, layers=4, heads=4, kv_heads=2, ffn=768, mtp_layers=1, seed=0)
BENCH_SPEC = ModelSpec(hidden=512, layers=24, heads=8, kv_heads=4, ffn=1536, mtp_layers=1, seed=0)
SIZES: dict[str, ModelSpec | None] = {"tiny": None, "quick": QUICK_SPEC, "bench": BENCH_SPEC}


def default_model_dir(task: str = "arith") -> str:
    """The pretrained tiny MiMo every default run uses (`labkit pretrain` writes it; it ships in data/); for the
    long-answer task (`task="chain"`), data/tiny-mimo-chain (`labkit pretrain --task chain`)."""
    check(task in ("arith", "chain"), "task", task, "arith or chain")
    return str(DEFAULT_DIR if task == "arith" else DEFAULT_DIR.parent / "tiny-mimo-chain")


# Shipped beside config.json so transformers/SGLang resolve `model_type: mimo` (as MiMo's own repo does).
_CONFIGURATION_MIMO = '''from transformers.models.qwen2.configuration_qwen2 import Qwen2Config


class MiMoConfig(Qwen2Config):
    model_type = "mimo"

    def __init__(self, *args, num_nextn_predict_layers=0, **kwargs):
        self.num_nextn_predict_layers = num_nextn_predict_layers
        super().__init__(*args, **kwargs)
'''


def hf_config(spec: ModelSpec) -> dict:
    return {
        "architectures": ["MiMoForCausalLM"],
        "model_type": "mimo",
        "auto_map": {"AutoConfig": "configuration_mimo.MiMoConfig"},
        "vocab_size": spec.vocab,
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "max_position_embeddings": spec.max_positions,
        "max_window_layers": spec.layers,
        "num_nextn_predict_layers": spec.mtp_layers,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "torch_dtype": "float32",
    }


def tensor_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """HF names and shapes of a MiMo checkpoint with these sizes (MTP layers under model.mtp_layers.{i}):
    labkit.models.naming applied to its config.json."""
    return dict(hf_tensors(hf_config(spec)))


def init_weights(spec: ModelSpec) -> dict:
    """Deterministic random weights. Norms are perturbed from 1 so parity checks exercise them."""
    import torch

    g = torch.Generator().manual_seed(spec.seed)
    out = {}
    for name, shape in tensor_shapes(spec).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith(".bias"):
            t = 0.02 * torch.randn(shape, generator=g)
        else:
            t = 0.02 * torch.randn(shape, generator=g)
        out[name] = t.contiguous()
    return out


def make_tiny_mimo(out: str | Path, spec: ModelSpec | None = None, weights: dict | None = None) -> Path:
    """Write a complete model directory (config, tokenizer, safetensors) and return its path."""
    from safetensors.torch import save_file

    spec = spec or ModelSpec()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(spec), indent=2))
    (out / "configuration_mimo.py").write_text(_CONFIGURATION_MIMO)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False}))
    save_char_tokenizer(out)
    save_file(weights if weights is not None else init_weights(spec), str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def save_weights_as(src: str | Path, out: str | Path, named_tensors) -> Path:
    """Copy a model directory, replacing its weights with `named_tensors` (e.g. a trainer export)."""
    from safetensors.torch import save_file

    src, out = Path(src), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy2(f, out / f.name)
    save_file({k: v.detach().contiguous().cpu() for k, v in dict(named_tensors).items()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def sized_model_dir(name: str, workdir: str | Path = "runs/models") -> str | None:
    """The directory of model `name` from SIZES (None for "tiny": Workbench's default, the shipped checkpoint).
    A generated one is written under `workdir`/<name> from its spec's seed, so every run measures the same tensors."""
    if name not in SIZES:
        raise ValueError(f"model={name!r} is invalid: expected one of {', '.join(map(repr, SIZES))}")
    spec = SIZES[name]
    return None if spec is None else str(make_tiny_mimo(Path(workdir) / name, spec))
