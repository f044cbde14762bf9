"""Reading an HF model directory, and transformers reference forwards (the parity oracle for the trainer).

`check_model_dir` validates the directory before anything heavy runs (the engine's start too). `ReferenceModel` runs
the trunk as transformers' Qwen2 and the MTP head exactly as MiMo/SGLang/vLLM compute it:
input_proj(cat([hidden_layernorm(h_i), token_layernorm(embed(t_{i+1}))])) -> decoder layer -> final_layernorm.
"""

from __future__ import annotations

import json
from pathlib import Path

# mbridge model types labkit has run end to end (README, Model families); others in mbridge's registry are refused.
KNOWN_MODEL_TYPES = ("mimo", "qwen2", "qwen3", "llama", "qwen3_moe", "deepseek_v3")


def check_model_dir(model_dir: str | Path, weights: bool = False) -> dict:
    """The parsed config.json of an HF model directory, checked before anything heavy starts: FileNotFoundError
    naming the directory when it is none, has no config.json or (with `weights`) no *.safetensors or *.bin
    weights; ValueError when config.json is not JSON. The one check of a model directory (the engine's start
    runs it too, labkit.engine.lifecycle)."""
    d = Path(model_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"model_dir={str(model_dir)!r} is not a directory")
    f = d / "config.json"
    if not f.is_file():
        raise FileNotFoundError(f"model_dir={str(model_dir)!r} has no config.json: expected an HF model directory")
    try:
        cfg = json.loads(f.read_text())
    except ValueError as e:
        raise ValueError(f"model_dir={str(model_dir)!r}: config.json is not valid JSON ({e})") from None
    if weights and not any(d.glob("*.safetensors")) and not any(d.glob("*.bin")):
        raise FileNotFoundError(f"model_dir={str(model_dir)!r} has no *.safetensors or *.bin weights")
    return cfg


def read_config_json(model_dir: str | Path) -> dict:
    """config.json of a model directory labkit trains (check_model_dir), refusing a model_type it has not run and
    a variant of a family it cannot serve (check_family)."""
    cfg = check_model_dir(model_dir)
    mt = cfg.get("model_type")
    if mt not in KNOWN_MODEL_TYPES:
        raise ValueError(f"model_type={mt!r} in {Path(model_dir) / 'config.json'} is not supported: expected one of "
                         f"{', '.join(KNOWN_MODEL_TYPES)}")
    check_family(cfg, Path(model_dir) / "config.json")
    return cfg


def check_family(cfg: dict, where) -> None:
    """Refuse, naming the field and its value, a config.json a family's trainer bridge would get wrong deep inside
    a Ray actor (valid in transformers, so nothing earlier objects): Qwen3-MoE with dense layers
    (`mlp_only_layers`, `decoder_sparse_step` > 1), where mbridge's Qwen3-MoE bridge builds routed experts on
    every layer and its loader then stops at `ValueError: Weights {...experts...} not found in safetensors files`,
    which names no field."""
    if cfg.get("model_type") == "qwen3_moe":
        if cfg.get("mlp_only_layers"):
            raise ValueError(f"mlp_only_layers={cfg['mlp_only_layers']} in {where} is not supported: the trainer's "
                             "bridge (mbridge's Qwen3-MoE) puts routed experts on every layer, so a dense layer's "
                             "MLP would not load; supported: mlp_only_layers=[]")
        if int(cfg.get("decoder_sparse_step") or 1) != 1:
            raise ValueError(f"decoder_sparse_step={cfg['decoder_sparse_step']} in {where} is not supported: the "
                             "trainer's bridge (mbridge's Qwen3-MoE) puts routed experts on every layer; "
                             "supported: decoder_sparse_step=1")


EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def num_experts(cfg) -> int:
    """Routed experts per MoE layer (0: dense) of a config.json dict or a transformers config: Qwen3-MoE's
    num_experts (saved as num_local_experts), DeepSeek-V3's n_routed_experts."""
    get = cfg.get if isinstance(cfg, dict) else (lambda k: getattr(cfg, k, None))
    return next((int(get(k)) for k in EXPERT_FIELDS if get(k)), 0)


def check_parallel(cfg: dict, tp: int, pp: int, ep: int = 1) -> None:
    """TP must divide the attention and KV heads, PP the layers, EP the routed experts of an MoE model (checked
    before any process starts: otherwise Megatron's assertion surfaces deep inside a Ray actor). A vocabulary TP
    does not divide is padded in the trainer (labkit.trainer.vocab)."""
    experts = num_experts(cfg)
    if ep > 1 and not experts:
        raise ValueError(f"ep={ep} is invalid: {cfg.get('model_type')!r} has no experts (expert parallelism is for "
                         "MoE models)")
    if experts % ep:
        raise ValueError(f"ep={ep} is invalid: it must divide the routed experts ({experts})")
    heads = cfg.get("num_attention_heads", 1)
    for what in ("num_attention_heads", "num_key_value_heads"):
        n = cfg.get(what, heads)
        if n % tp:
            raise ValueError(f"tp={tp} is invalid: it must divide {what}={n}")
    layers = cfg.get("num_hidden_layers", 1)
    if layers % pp:
        raise ValueError(f"pp={pp} is invalid: it must divide num_hidden_layers={layers}")


def load_hf_config(model_dir: str | Path):
    """A transformers config object for mbridge. MiMo is a Qwen2 config plus `num_nextn_predict_layers`."""
    from transformers import AutoConfig, Qwen2Config

    cfg = read_config_json(model_dir)
    if cfg["model_type"] == "mimo":
        keep = {k: v for k, v in cfg.items() if k not in ("model_type", "auto_map", "architectures")}
        hf = Qwen2Config(**keep)
        hf.model_type = "mimo"
        hf.architectures = cfg.get("architectures", ["MiMoForCausalLM"])
        hf.num_nextn_predict_layers = int(cfg.get("num_nextn_predict_layers", 0))
    else:
        hf = AutoConfig.from_pretrained(str(model_dir))
    fix_rope_theta(hf)
    return hf


def fix_rope_theta(hf_config) -> None:
    """transformers 5 moved `rope_theta` into `rope_parameters`; mbridge and the reference forward still read
    `rope_theta` and would otherwise fail (or silently use another base). Lives here, beside the config reader,
    so models/ never imports the trainer (labkit.trainer.bridge applies it too)."""
    if getattr(hf_config, "rope_theta", None) is None:
        params = getattr(hf_config, "rope_parameters", None) or {}
        hf_config.rope_theta = params.get("rope_theta", 10000.0)


class ReferenceModel:
    """transformers Qwen2 trunk + MiMo-order MTP heads, loaded from HF-named tensors (fp32, CPU)."""

    def __init__(self, model_dir: str | Path, named_tensors=None):
        import torch
        from safetensors.torch import load_file
        from transformers import Qwen2Config, Qwen2ForCausalLM
        from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RMSNorm

        cfg = read_config_json(model_dir)
        keep = {k: v for k, v in cfg.items() if k not in ("model_type", "auto_map", "architectures")}
        self.config = Qwen2Config(**keep)
        self.config._attn_implementation = "sdpa"  # sdpa with mask=None is causal; eager would not be
        weights = (dict(named_tensors) if named_tensors is not None
                   else load_file(str(Path(model_dir) / "model.safetensors")))
        with torch.device("cpu"):
            self.trunk = Qwen2ForCausalLM(self.config).float().eval()
        trunk_sd = {k: v for k, v in weights.items() if ".mtp_layers." not in k}
        self.trunk.load_state_dict(trunk_sd, strict=True)
        self.mtp = []
        n_mtp = int(cfg.get("num_nextn_predict_layers", 0))
        h, eps = self.config.hidden_size, self.config.rms_norm_eps
        for i in range(n_mtp):
            p = f"model.mtp_layers.{i}."
            layer = Qwen2DecoderLayer(self.config, layer_idx=0).float().eval()
            layer.load_state_dict({k[len(p):]: v for k, v in weights.items()
                                   if k.startswith(p) and k[len(p):].split(".")[0] in
                                   ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")}, strict=True)
            norms = {n: Qwen2RMSNorm(h, eps=eps).eval()
                     for n in ("token_layernorm", "hidden_layernorm", "final_layernorm")}
            for n, m in norms.items():
                m.weight.data.copy_(weights[p + n + ".weight"])
            proj = torch.nn.Linear(2 * h, h, bias=False).eval()
            proj.weight.data.copy_(weights[p + "input_proj.weight"])
            self.mtp.append({"layer": layer, "proj": proj, **norms})

    def forward(self, tokens):
        """Main logits [b, s, V] and, per MTP layer, logits [b, s, V] where position i predicts t_{i+2+k}."""
        import torch

        with torch.no_grad():
            logits, hidden = self.trunk_forward(tokens)
            mtp_logits, ids = [], tokens
            for i in range(len(self.mtp)):
                ids = torch.roll(ids, -1, dims=1)
                ids[:, -1] = 0  # Megatron's roll_tensor zero-fills the wrapped position
                m, hidden = self.mtp_forward(i, hidden, ids)
                mtp_logits.append(m)
            return {"logits": logits, "mtp_logits": mtp_logits}

    def trunk_forward(self, tokens):
        """Main logits [b, s, V] and the last hidden states [b, s, h], post final norm: what the MTP head reads."""
        import torch

        with torch.no_grad():
            out = self.trunk(input_ids=tokens, output_hidden_states=True)
            return out.logits.float(), out.hidden_states[-1]  # post final norm, as Megatron and SGLang hand it over

    def mtp_forward(self, i: int, hidden, next_tokens, zero_first: bool = False):
        """MTP layer i over the pairs (hidden[:, j], next_tokens[:, j]) at positions j (causal).

        Returns its logits [b, s, V] and its output hidden states after final_layernorm (what the next MTP
        depth reads, in Megatron's chain and in SGLang's draft steps). `zero_first`: the token embedding at
        position 0 zeroed, as SGLang's draft model does (`models/mimo_mtp.py:58`, 0.5.23: "masking inputs at
        position 0, as not needed by MTP"); the trainer does not.
        """
        import torch

        head = self.mtp[i]
        with torch.no_grad():
            emb = self.trunk.model.embed_tokens(next_tokens)
            if zero_first:
                emb[:, 0] = 0
            x = head["proj"](torch.cat([head["hidden_layernorm"](hidden), head["token_layernorm"](emb)], dim=-1))
            pos = torch.arange(next_tokens.shape[1], device=next_tokens.device).unsqueeze(0).expand_as(next_tokens)
            rope = self.trunk.model.rotary_emb(x, pos)
            x = head["layer"](x, attention_mask=None, position_ids=pos, position_embeddings=rope)
            x = x[0] if isinstance(x, tuple) else x
            out = head["final_layernorm"](x)
            return self.trunk.lm_head(out).float(), out

    def to(self, device) -> ReferenceModel:
        """Move every module (trunk and MTP heads) to `device`; returns self."""
        self.trunk.to(device)
        for head in self.mtp:
            for m in head.values():
                m.to(device)
        return self


_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
              "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def checkpoint_tensors(model_dir: str | Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Names, shapes and dtypes of every tensor in the directory's safetensors files (headers only)."""
    import struct

    out = {}
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model_dir={str(model_dir)!r} has no *.safetensors weights")
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                out[name] = (tuple(info["shape"]), _ST_DTYPES.get(info["dtype"], info["dtype"].lower()))
    return out
