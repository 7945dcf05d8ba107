"""HF Llama/Qwen2 <-> megatron-core GPTModel state dicts, with tensor-parallel (un)sharding.

megatron-bridge (NeMo RL's converter) needs CUDA to install, so the mapping is written
out here. Layout differences that matter:
- Q, K and V are one ``linear_qkv`` weight, interleaved per query group:
  ``[g0: q_0..q_{n-1}, k, v | g1: ...]`` (n = heads per group), so a TP shard is a
  contiguous run of whole groups.
- ``gate_proj`` and ``up_proj`` are one ``linear_fc1``; each TP rank holds
  ``[gate shard; up shard]``, so sharding splits gate and up separately.
- The vocabulary is padded to a multiple of the TP size; padded rows are zeros and are
  dropped again on export.
- Tied embeddings have no ``output_layer``/``lm_head`` entry on either side.
- Norm weights live in ``input_layernorm``/``pre_mlp_layernorm`` with megatron's local spec
  and inside ``linear_qkv``/``linear_fc1`` (``layer_norm_weight``) with the Transformer
  Engine spec (``fused_norms=True``).
Only copies and concatenations happen, so HF -> Megatron -> HF is bit-exact.
"""

from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")


class UnsupportedModelError(ValueError):
    """An HF model this converter cannot map (architecture, rope scaling, head layout)."""


@dataclass(frozen=True)
class GPTLayout:
    """The shape facts the mapping needs, read once from an HF config."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> "GPTLayout":
        architectures = getattr(hf_config, "architectures", None) or []
        model_type = hf_config.model_type
        if model_type not in ("llama", "qwen2") and not set(architectures) & set(
            SUPPORTED_ARCHITECTURES
        ):
            raise UnsupportedModelError(
                f"model_type {model_type!r} (architectures {architectures}) is not supported by "
                f"the Megatron backend; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        heads = hf_config.num_attention_heads
        return cls(
            num_layers=hf_config.num_hidden_layers,
            hidden_size=hf_config.hidden_size,
            num_heads=heads,
            num_query_groups=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
            vocab_size=hf_config.vocab_size,
            tied_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            qkv_bias=model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        )

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups

    def padded_vocab_size(self, tp_size: int) -> int:
        return -(-self.vocab_size // tp_size) * tp_size

    def check_tp(self, tp_size: int) -> None:
        """Whole query groups per rank and an even FFN split are what TP sharding needs."""
        if self.num_query_groups % tp_size:
            raise UnsupportedModelError(
                f"megatron_cfg.tensor_model_parallel_size={tp_size} must divide the model's "
                f"num_key_value_heads={self.num_query_groups}"
            )


def _norm_keys(layer: str, fused_norms: bool) -> tuple[str, str]:
    if fused_norms:
        return (
            f"{layer}self_attention.linear_qkv.layer_norm_weight",
            f"{layer}mlp.linear_fc1.layer_norm_weight",
        )
    return f"{layer}input_layernorm.weight", f"{layer}pre_mlp_layernorm.weight"


def _fuse_qkv(lay: GPTLayout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    groups, per_group, hd = lay.num_query_groups, lay.heads_per_group, lay.head_dim
    rest = q.shape[1:]
    fused = torch.cat(
        [
            q.reshape(groups, per_group * hd, *rest),
            k.reshape(groups, hd, *rest),
            v.reshape(groups, hd, *rest),
        ],
        dim=1,
    )
    return fused.reshape(groups * (per_group + 2) * hd, *rest)


def _split_qkv(
    fused: torch.Tensor, lay: GPTLayout
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, per_group, hd = lay.num_query_groups, lay.heads_per_group, lay.head_dim
    rest = fused.shape[1:]
    grouped = fused.reshape(groups, (per_group + 2) * hd, *rest)
    q, k, v = torch.split(grouped, [per_group * hd, hd, hd], dim=1)
    return (
        q.reshape(groups * per_group * hd, *rest).clone(),
        k.reshape(groups * hd, *rest).clone(),
        v.reshape(groups * hd, *rest).clone(),
    )


def _pad_vocab(weight: torch.Tensor, padded: int) -> torch.Tensor:
    if weight.shape[0] == padded:
        return weight
    pad = weight.new_zeros(padded - weight.shape[0], *weight.shape[1:])
    return torch.cat([weight, pad], dim=0)


def _shard(t: torch.Tensor, dim: int, tp_size: int, tp_rank: int) -> torch.Tensor:
    return torch.chunk(t, tp_size, dim=dim)[tp_rank].clone()


def hf_to_megatron(
    hf_state: dict[str, torch.Tensor],
    layout: GPTLayout,
    *,
    tp_size: int = 1,
    tp_rank: int = 0,
    fused_norms: bool = False,
) -> dict[str, torch.Tensor]:
    """One TP rank's GPTModel state dict from a full HF state dict."""
    layout.check_tp(tp_size)
    padded = layout.padded_vocab_size(tp_size)

    def col(t: torch.Tensor) -> torch.Tensor:
        return _shard(t, 0, tp_size, tp_rank)

    def row(t: torch.Tensor) -> torch.Tensor:
        return _shard(t, 1, tp_size, tp_rank)

    out = {
        "embedding.word_embeddings.weight": col(
            _pad_vocab(hf_state["model.embed_tokens.weight"], padded)
        ),
        "decoder.final_layernorm.weight": hf_state["model.norm.weight"].clone(),
    }
    if not layout.tied_embeddings:
        out["output_layer.weight"] = col(_pad_vocab(hf_state["lm_head.weight"], padded))
    for i in range(layout.num_layers):
        hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = hf + "self_attn."
        out[mc + "self_attention.linear_qkv.weight"] = col(
            _fuse_qkv(layout, *(hf_state[f"{attn}{p}_proj.weight"] for p in "qkv"))
        )
        if layout.qkv_bias:
            out[mc + "self_attention.linear_qkv.bias"] = col(
                _fuse_qkv(layout, *(hf_state[f"{attn}{p}_proj.bias"] for p in "qkv"))
            )
        out[mc + "self_attention.linear_proj.weight"] = row(hf_state[attn + "o_proj.weight"])
        gate, up = hf_state[hf + "mlp.gate_proj.weight"], hf_state[hf + "mlp.up_proj.weight"]
        out[mc + "mlp.linear_fc1.weight"] = torch.cat([col(gate), col(up)], dim=0)
        out[mc + "mlp.linear_fc2.weight"] = row(hf_state[hf + "mlp.down_proj.weight"])
        attn_norm, mlp_norm = _norm_keys(mc, fused_norms)
        out[attn_norm] = hf_state[hf + "input_layernorm.weight"].clone()
        out[mlp_norm] = hf_state[hf + "post_attention_layernorm.weight"].clone()
    return out


def megatron_to_hf(
    shards: list[dict[str, torch.Tensor]], layout: GPTLayout, *, fused_norms: bool = False
) -> dict[str, torch.Tensor]:
    """A full HF state dict from every TP rank's GPTModel state dict, in rank order."""

    def col(key: str) -> torch.Tensor:
        return torch.cat([s[key] for s in shards], dim=0)

    def row(key: str) -> torch.Tensor:
        return torch.cat([s[key] for s in shards], dim=1)

    first = shards[0]
    vocab = layout.vocab_size
    out = {
        "model.embed_tokens.weight": col("embedding.word_embeddings.weight")[:vocab].clone(),
        "model.norm.weight": first["decoder.final_layernorm.weight"].clone(),
    }
    if not layout.tied_embeddings:
        out["lm_head.weight"] = col("output_layer.weight")[:vocab].clone()
    for i in range(layout.num_layers):
        hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
        attn = hf + "self_attn."
        q, k, v = _split_qkv(col(mc + "self_attention.linear_qkv.weight"), layout)
        out.update(
            {attn + "q_proj.weight": q, attn + "k_proj.weight": k, attn + "v_proj.weight": v}
        )
        if layout.qkv_bias:
            q, k, v = _split_qkv(col(mc + "self_attention.linear_qkv.bias"), layout)
            out.update({attn + "q_proj.bias": q, attn + "k_proj.bias": k, attn + "v_proj.bias": v})
        out[attn + "o_proj.weight"] = row(mc + "self_attention.linear_proj.weight")
        halves = [torch.chunk(s[mc + "mlp.linear_fc1.weight"], 2, dim=0) for s in shards]
        out[hf + "mlp.gate_proj.weight"] = torch.cat([h[0] for h in halves], dim=0)
        out[hf + "mlp.up_proj.weight"] = torch.cat([h[1] for h in halves], dim=0)
        out[hf + "mlp.down_proj.weight"] = row(mc + "mlp.linear_fc2.weight")
        attn_norm, mlp_norm = _norm_keys(mc, fused_norms)
        out[hf + "input_layernorm.weight"] = first[attn_norm].clone()
        out[hf + "post_attention_layernorm.weight"] = first[mlp_norm].clone()
    return out
