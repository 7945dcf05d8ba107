"""HF <-> Megatron weight mapping: bit-exact round trips, TP shards, the fused layouts."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from nemo_rl_core.models.local_models import build_tiny_model
from nemo_rl_core.models.megatron.converters import (
    GPTLayout,
    UnsupportedModelError,
    hf_to_megatron,
    megatron_to_hf,
)


@pytest.fixture(scope="module")
def wide_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 query groups of 2 heads, untied, qkv bias, odd vocab (exercises TP=4 and padding)."""
    return build_tiny_model(
        tmp_path_factory.mktemp("models") / "qwen2-wide",
        "qwen2",
        num_attention_heads=8,
        num_key_value_heads=4,
        tie_word_embeddings=False,
        vocab_size=301,
    )


def _load(model_dir: Path) -> tuple[dict[str, torch.Tensor], GPTLayout]:
    return load_file(model_dir / "model.safetensors"), GPTLayout.from_hf_config(
        AutoConfig.from_pretrained(model_dir)
    )


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("fused_norms", [False, True], ids=["local", "te"])
@pytest.mark.parametrize("model", ["tiny_model_dir", "tiny_qwen2_dir", "wide_qwen2"])
def test_round_trip_is_bit_exact(request, model, tp, fused_norms) -> None:
    hf_state, layout = _load(request.getfixturevalue(model))
    if layout.num_query_groups % tp:
        with pytest.raises(UnsupportedModelError, match="tensor_model_parallel_size"):
            hf_to_megatron(hf_state, layout, tp_size=tp)
        return
    shards = [
        hf_to_megatron(hf_state, layout, tp_size=tp, tp_rank=r, fused_norms=fused_norms)
        for r in range(tp)
    ]
    back = megatron_to_hf(shards, layout, fused_norms=fused_norms)
    assert set(back) == set(hf_state)
    for key, value in hf_state.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key


def test_fused_layouts(tiny_qwen2_dir) -> None:
    """Group g of linear_qkv is [q heads of g; k_g; v_g]; linear_fc1 is [gate; up] per shard."""
    hf_state, layout = _load(tiny_qwen2_dir)
    hd, per_group = layout.head_dim, layout.heads_per_group
    tp = 2
    shards = [hf_to_megatron(hf_state, layout, tp_size=tp, tp_rank=r) for r in range(tp)]
    q = hf_state["model.layers.1.self_attn.q_proj.weight"]
    k = hf_state["model.layers.1.self_attn.k_proj.weight"]
    v = hf_state["model.layers.1.self_attn.v_proj.weight"]
    bias_k = hf_state["model.layers.1.self_attn.k_proj.bias"]
    groups_per_rank = layout.num_query_groups // tp
    for rank, shard in enumerate(shards):
        qkv = shard["decoder.layers.1.self_attention.linear_qkv.weight"]
        bias = shard["decoder.layers.1.self_attention.linear_qkv.bias"]
        for local in range(groups_per_rank):
            g = rank * groups_per_rank + local
            block = qkv[local * (per_group + 2) * hd : (local + 1) * (per_group + 2) * hd]
            assert torch.equal(
                block[: per_group * hd], q[g * per_group * hd : (g + 1) * per_group * hd]
            )
            assert torch.equal(
                block[per_group * hd : (per_group + 1) * hd], k[g * hd : (g + 1) * hd]
            )
            assert torch.equal(block[(per_group + 1) * hd :], v[g * hd : (g + 1) * hd])
            bias_block = bias[local * (per_group + 2) * hd : (local + 1) * (per_group + 2) * hd]
            assert torch.equal(
                bias_block[per_group * hd : (per_group + 1) * hd], bias_k[g * hd : (g + 1) * hd]
            )
        fc1 = shard["decoder.layers.1.mlp.linear_fc1.weight"]
        gate = hf_state["model.layers.1.mlp.gate_proj.weight"].chunk(tp)[rank]
        up = hf_state["model.layers.1.mlp.up_proj.weight"].chunk(tp)[rank]
        assert torch.equal(fc1, torch.cat([gate, up]))
        proj = shard["decoder.layers.1.self_attention.linear_proj.weight"]
        assert torch.equal(
            proj, hf_state["model.layers.1.self_attn.o_proj.weight"].chunk(tp, 1)[rank]
        )


def test_vocab_padding_and_tied_embeddings(wide_qwen2, tiny_model_dir) -> None:
    hf_state, layout = _load(wide_qwen2)
    assert layout.vocab_size % 4, "the fixture needs a vocab that 4 does not divide"
    shards = [hf_to_megatron(hf_state, layout, tp_size=4, tp_rank=r) for r in range(4)]
    rows = sum(s["embedding.word_embeddings.weight"].shape[0] for s in shards)
    assert rows == layout.padded_vocab_size(4) > layout.vocab_size
    assert torch.count_nonzero(shards[-1]["output_layer.weight"][-1]) == 0
    tied_state, tied = _load(tiny_model_dir)
    assert tied.tied_embeddings and "lm_head.weight" not in tied_state
    assert "output_layer.weight" not in hf_to_megatron(tied_state, tied)


def test_unsupported_architecture_is_named() -> None:
    config = AutoConfig.for_model("gpt2")
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        GPTLayout.from_hf_config(config)
