"""The state dict the checkpoint benchmark saves: a decoder-only transformer's
training state (Llama-style shapes), sized to a target number of bytes.

* model weights in bf16: token embedding ``[vocab, hidden]``, per layer the
  attention projections (q/o ``[hidden, hidden]``, k/v ``[kv, hidden]`` with
  grouped-query attention, half as many KV heads), the SwiGLU MLP
  (gate/up ``[ffn, hidden]``, down ``[hidden, ffn]``) and two RMSNorm
  vectors, the final norm and an untied LM head;
* AdamW's state per parameter: ``exp_avg`` and ``exp_avg_sq`` in fp32 (the
  model's shape) and ``step`` (an fp32 scalar tensor, as torch.optim keeps
  it), keyed by the parameter's name, plus ``param_groups`` (plain Python:
  hyper-parameters and the parameter names) and a few top-level items.

10 bytes per parameter (2 + 4 + 4). The hidden size follows the target
(1024 up to 3 GiB, 2048 up to 12 GiB, 4096 above), the layer count takes
about 80% of the bytes and the vocabulary (a multiple of 64) the rest, so
the total lands within a few MB of the target: 2 GiB is 14 layers of 1024
with a 24k vocabulary (516 tensors), 8 GiB 14 layers of 2048 with 48k.

Pure Python (no torch): run.py records the layout, every worker builds the
same tensors from it (``build`` in worker.py: random bits, seeded per tensor).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

GIB = 1 << 30
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


def config_for(target_bytes: int) -> Dict[str, int]:
    """A model configuration whose training state is about ``target_bytes``."""
    hidden = 1024 if target_bytes <= 3 * GIB else 2048 if target_bytes <= 12 * GIB else 4096
    heads = hidden // 64
    kv = (heads // 2) * 64
    ffn = -(-(8 * hidden // 3) // 256) * 256
    per_layer = 2 * hidden * hidden + 2 * kv * hidden + 3 * ffn * hidden + 2 * hidden
    per_layer_bytes = per_layer * 10 + 9 * 4  # + one fp32 step per parameter tensor
    layers = max(2, int(target_bytes * 0.8) // per_layer_bytes)
    rest = target_bytes - layers * per_layer_bytes - (hidden * 10 + 4) - 2 * 4
    vocab = max(1024, rest // (2 * hidden * 10) // 64 * 64)
    return {"hidden": hidden, "heads": heads, "kv_dim": kv, "ffn": ffn, "layers": layers, "vocab": vocab}


def parameters(cfg: Dict[str, int]) -> List[Tuple[str, Tuple[int, ...]]]:
    """(name, shape) of every model parameter, in the model's order."""
    h, kv, f = cfg["hidden"], cfg["kv_dim"], cfg["ffn"]
    out: List[Tuple[str, Tuple[int, ...]]] = [("model.embed_tokens.weight", (cfg["vocab"], h))]
    for i in range(cfg["layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (f, h)),
            (p + "mlp.up_proj.weight", (f, h)),
            (p + "mlp.down_proj.weight", (h, f)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (cfg["vocab"], h))]
    return out


def tensors(cfg: Dict[str, int]) -> List[Tuple[Tuple[str, ...], str, Tuple[int, ...]]]:
    """(path in the state dict, dtype, shape) of every tensor."""
    params = parameters(cfg)
    out: List[Tuple[Tuple[str, ...], str, Tuple[int, ...]]] = [(("model", n), "bfloat16", s) for n, s in params]
    for n, s in params:
        out += [
            (("optim", "state", n, "step"), "float32", ()),
            (("optim", "state", n, "exp_avg"), "float32", s),
            (("optim", "state", n, "exp_avg_sq"), "float32", s),
        ]
    return out


def plain_items(cfg: Dict[str, int]) -> Dict[Tuple[str, ...], Any]:
    """The state dict's non-tensor items (path -> value)."""
    names = [n for n, _ in parameters(cfg)]
    group = {
        "lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "amsgrad": False,
        "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": None,
        "params": names,
    }  # fmt: skip
    return {
        ("optim", "param_groups"): [group],
        ("step",): 1000,
        ("config",): dict(cfg),
    }


def nbytes(shape: Tuple[int, ...], dtype: str) -> int:
    n = DTYPE_BYTES[dtype]
    for d in shape:
        n *= d
    return n


def describe(target_bytes: int) -> Dict[str, Any]:
    """The layout run.py records and hands to the workers."""
    cfg = config_for(target_bytes)
    ts = tensors(cfg)
    sizes = [nbytes(s, d) for _, d, s in ts]
    model = sum(b for (p, _, _), b in zip(ts, sizes) if p[0] == "model")
    return {
        "target_bytes": target_bytes,
        "config": cfg,
        "tensors": len(ts),
        "state_bytes": sum(sizes),
        "model_bytes_bf16": model,
        "optimizer_bytes_fp32": sum(sizes) - model,
        "parameters": sum(b for (p, _, _), b in zip(ts, sizes) if p[0] == "model") // 2,
        "largest_tensor_bytes": max(sizes),
        "smallest_tensor_bytes": min(sizes),
        "tensors_over_1MiB": sum(1 for b in sizes if b >= 1 << 20),
    }
