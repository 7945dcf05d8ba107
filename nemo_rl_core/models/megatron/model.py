"""Build a megatron-core GPTModel that computes what an HF Llama/Qwen2 computes.

Also owns the process-wide parallel state (torch.distributed + megatron's
``parallel_state``), which every Megatron model in a process shares.
"""

import importlib.util
import os
from typing import Any

import torch
import torch.distributed as dist

from nemo_rl_core.models.megatron.config import MegatronConfig
from nemo_rl_core.models.megatron.converters import GPTLayout, UnsupportedModelError
from nemo_rl_core.models.megatron.cpu_compat import apply_cpu_compat

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def use_transformer_engine(cfg: MegatronConfig) -> bool:
    """TE spec only with CUDA and TE installed ("auto"), or when asked for explicitly."""
    available = torch.cuda.is_available() and importlib.util.find_spec("transformer_engine")
    if cfg.transformer_impl == "transformer_engine" and not available:
        raise RuntimeError(
            "megatron_cfg.transformer_impl='transformer_engine' needs CUDA and the "
            "transformer_engine package; use 'auto' or 'local'"
        )
    return cfg.transformer_impl == "transformer_engine" or (
        cfg.transformer_impl == "auto" and bool(available)
    )


def rope_theta(hf_config: Any) -> float:
    """RoPE base from transformers 5 ``rope_parameters`` (or the older ``rope_theta``)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise UnsupportedModelError(
            f"rope_type {rope_type!r} is not supported by the Megatron backend (only 'default')"
        )
    return float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


def init_parallel_state(tp_size: int, seed: int) -> None:
    """Initialize torch.distributed (gloo on CPU, nccl on GPU) and megatron's groups, once.

    Outside torchrun (world size 1, in-process) a single-rank group on an in-memory store:
    a free port picked here could be taken before the bind, and ``MASTER_PORT`` set in this
    process's environment made its subprocesses (benches, TRL's vLLM) bind the same port.
    """
    from megatron.core import parallel_state, tensor_parallel

    apply_cpu_compat()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if "RANK" in os.environ:  # a rank torchrun started
            dist.init_process_group(backend)
        else:  # the one rank: no TCP port to race for, nothing children would inherit
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if parallel_state.model_parallel_is_initialized():
        current = parallel_state.get_tensor_model_parallel_world_size()
        if current != tp_size:
            raise RuntimeError(
                f"this process already runs Megatron with tensor_model_parallel_size={current}; "
                f"a second model asked for {tp_size}"
            )
        return
    world = dist.get_world_size()
    if world % tp_size:
        raise ValueError(
            f"megatron_cfg.tensor_model_parallel_size={tp_size} must divide the world size {world}"
        )
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def transformer_config(
    layout: GPTLayout, hf_config: Any, cfg: MegatronConfig, *, use_te: bool
) -> Any:
    """The megatron ``TransformerConfig`` matching ``hf_config``, with ``cfg``'s parallelism."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp = cfg.tensor_model_parallel_size
    params_dtype = DTYPES[cfg.optimizer.params_dtype]
    on_gpu = torch.cuda.is_available()
    recompute: dict[str, Any] = {}
    if cfg.activation_checkpointing and cfg.recompute_granularity == "full":
        recompute = {"recompute_granularity": "full", "recompute_method": "uniform"}
        recompute["recompute_num_layers"] = 1
    elif cfg.activation_checkpointing:
        recompute = {
            "recompute_granularity": "selective",
            "recompute_modules": cfg.recompute_modules or ["core_attn"],
        }
    return TransformerConfig(
        num_layers=layout.num_layers,
        hidden_size=layout.hidden_size,
        num_attention_heads=layout.num_heads,
        num_query_groups=layout.num_query_groups,
        kv_channels=layout.head_dim,
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=layout.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        sequence_parallel=cfg.sequence_parallel and tp > 1,
        params_dtype=params_dtype,
        pipeline_dtype=DTYPES[cfg.pipeline_dtype] if cfg.pipeline_dtype else params_dtype,
        bf16=cfg.optimizer.bf16,
        fp16=cfg.optimizer.fp16,
        use_cpu_initialization=True,
        # Initialization also tags parameters as tensor-parallel (for grad-norm accounting);
        # the random values are overwritten by the converted HF weights.
        perform_initialization=True,
        # The fused kernels exist only on GPU; on CPU they are turned off whatever the config.
        # Persistent layer norm and the fused masked softmax come from Transformer Engine or
        # apex: the local spec on a GPU without them uses torch's norm and softmax.
        apply_rope_fusion=cfg.apply_rope_fusion and use_te,
        bias_activation_fusion=cfg.bias_activation_fusion and on_gpu,
        masked_softmax_fusion=use_te,
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=on_gpu,
        persist_layer_norm=use_te,
        **attention_backend(cfg),
        **recompute,
    )


def attention_backend(cfg: MegatronConfig) -> dict[str, Any]:
    """megatron-core's ``attention_backend`` when the config names one. Like NeMo RL, the
    ``NVTE_*_ATTN`` variables are cleared first: the model sets them from the backend and
    asserts any already set agree."""
    if cfg.attention_backend is None:
        return {}
    from megatron.core.transformer.enums import AttnBackend

    for variable in ("NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_UNFUSED_ATTN"):
        os.environ.pop(variable, None)
    return {"attention_backend": AttnBackend[cfg.attention_backend]}


def build_gpt_model(hf_config: Any, cfg: MegatronConfig, *, use_te: bool) -> Any:
    """A GPTModel on this rank's device with random weights (load HF weights after)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    layout = GPTLayout.from_hf_config(hf_config)
    tp = cfg.tensor_model_parallel_size
    layout.check_tp(tp)
    spec = (
        get_gpt_layer_with_transformer_engine_spec()
        if use_te
        else get_gpt_layer_local_spec(normalization="RMSNorm")
    )
    model = GPTModel(
        config=transformer_config(layout, hf_config, cfg, use_te=use_te),
        transformer_layer_spec=spec,
        vocab_size=layout.padded_vocab_size(tp),
        max_sequence_length=hf_config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=rope_theta(hf_config),
        share_embeddings_and_output_weights=layout.tied_embeddings,
        parallel_output=False,
    )
    if torch.cuda.is_available():
        model = model.cuda()
    return model
