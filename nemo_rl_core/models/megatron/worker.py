"""One rank of the Megatron backend: a GPTModel shard, Megatron DDP, optimizer and scheduler.

Every rank receives the whole batch and takes its data-parallel share, so the driver never
needs to know the parallel layout. Results come back per rank; ``MegatronWorker.result_rank``
says which ranks' results to keep (tensor-parallel rank 0 of every data-parallel rank).

Train step (NeMo RL's semantics, same as the HF backend): per global batch, losses are
normalized by the global valid sequence/token counts (``token_mask[:, 1:] * sample_mask``
over the whole global batch), summed over microbatches and data-parallel ranks. Megatron's
schedule divides each microbatch loss by the number of microbatches and Megatron DDP
averages gradients over data-parallel ranks; the loss handed to backward is scaled by both
so the gradient is that of the global loss.
"""

import copy
import gc
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from nemo_rl_core.algorithms.loss.interfaces import LossFunction
from nemo_rl_core.algorithms.loss.utils import next_token_logprobs_from_logits, prepare_loss_input
from nemo_rl_core.algorithms.utils import calculate_global_valid_counts
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict, DynamicBatchingArgs
from nemo_rl_core.models.megatron.config import MegatronConfig
from nemo_rl_core.models.megatron.converters import GPTLayout, hf_to_megatron, megatron_to_hf
from nemo_rl_core.models.megatron.cpu_compat import cuda_as_cpu
from nemo_rl_core.models.megatron.model import (
    DTYPES,
    build_gpt_model,
    init_parallel_state,
    use_transformer_engine,
)
from nemo_rl_core.models.megatron.offload import ParkedStorages, distinct_storages
from nemo_rl_core.models.policy.config import TrainedModelConfig
from nemo_rl_core.models.policy.forward_layout import ForwardLayout, padded_layout
from nemo_rl_core.models.policy.hf_loading import load_hf_config
from nemo_rl_core.models.policy.offload import release_device_memory
from nemo_rl_core.utils.config import filled

Head = Literal["lm", "value"]


class NonFiniteLossError(FloatingPointError):
    """A loss was NaN/Inf; the optimizer step was skipped on every rank."""


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a rank needs to build its model; picklable, sent to torchrun ranks."""

    config: TrainedModelConfig  # PolicyConfig or ValueConfig
    model_path: str  # HF directory: config.json (+ weights unless weights_path is given)
    weights_path: str | None = None
    optimizer_path: str | None = None
    init_optimizer: bool = True
    init_reference_model: bool = True
    head: Head = "lm"
    seed: int = 42

    @property
    def megatron_cfg(self) -> MegatronConfig:
        return self.config.megatron_cfg or MegatronConfig(enabled=True)


class ValueHead(torch.nn.Module):
    """A scalar head standing in for GPTModel's ``output_layer`` (replicated over TP ranks)."""

    def __init__(self, hidden_size: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=dtype))

    def forward(
        self, hidden: torch.Tensor, weight: torch.Tensor | None = None, **_: Any
    ) -> tuple[torch.Tensor, None]:
        return torch.nn.functional.linear(hidden, self.weight, self.bias), None


def _as_metric(value: Any) -> Any:
    return value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value


class MegatronWorker:
    """The model shard of this rank and every operation the policy/value object forwards."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.cfg = spec.config
        mcfg = spec.megatron_cfg
        # What leaves device memory between steps (``offload``) and comes back (``onload``).
        self._parked_weights = ParkedStorages(keep_values=True)
        self._parked_grads = ParkedStorages(keep_values=False)
        self._parked_optimizer = ParkedStorages(keep_values=True)
        self.tp = mcfg.tensor_model_parallel_size
        init_parallel_state(self.tp, spec.seed)
        from megatron.core import parallel_state

        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.hf_config = load_hf_config(spec.model_path, self.cfg)
        self.layout = GPTLayout.from_hf_config(self.hf_config)
        self.use_te = use_transformer_engine(mcfg)
        self.half = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(self.cfg.precision)
        self.mcfg = mcfg.model_copy(
            update={
                "optimizer": mcfg.optimizer.model_copy(
                    update={
                        "bf16": self.half is torch.bfloat16,
                        "fp16": self.half is torch.float16,
                    }
                )
            }
        )
        self.gpt = build_gpt_model(self.hf_config, self.mcfg, use_te=self.use_te)
        if spec.head == "value":
            self.gpt.output_layer = ValueHead(self.layout.hidden_size, self.gpt.config.params_dtype)
            self.gpt.share_embeddings_and_output_weights = False
        generation = getattr(self.cfg, "generation", None)
        temperature = generation.temperature if generation else 1.0
        self.temperature = temperature if temperature > 0 else 1.0
        # NeMo RL keeps the *base* model as reference, even when resuming from a checkpoint.
        self._load_hf_weights(Path(spec.model_path))
        self.reference_state = (
            self._weights_snapshot() if spec.init_reference_model and spec.head == "lm" else None
        )
        if spec.weights_path is not None:
            self._load_hf_weights(Path(spec.weights_path))
        self.model = self._wrap()
        # megatron-core is untyped (Any); both stay None with init_optimizer=False.
        self.optimizer: Any = None
        self.scheduler: Any = None
        self._optimizer_on_host = False  # megatron's optimizer_cpu_offload keeps it there
        if spec.init_optimizer:
            self._build_optimizer()
        if spec.optimizer_path is not None:
            self.load_optimizer(spec.optimizer_path)

    # ---- construction -----------------------------------------------------------------

    def _weights_snapshot(self) -> dict[str, torch.Tensor]:
        return {
            k: v.detach().clone()
            for k, v in self.gpt.state_dict().items()
            if "_extra_state" not in k
        }

    def _load_hf_weights(self, path: Path) -> None:
        from safetensors.torch import load_file

        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{path} holds no *.safetensors weights to load")
        hf_state: dict[str, torch.Tensor] = {}
        for file in files:
            hf_state.update(load_file(file))
        value = self.spec.head == "value"
        state = hf_to_megatron(
            {k: v.to(self.gpt.config.params_dtype) for k, v in hf_state.items()},
            self._lm_layout() if value else self.layout,
            tp_size=self.tp,
            tp_rank=self.tp_rank,
            fused_norms=self.use_te,
        )
        if value:
            state["output_layer.weight"] = hf_state.get(
                "score.weight", torch.zeros(1, self.layout.hidden_size)
            ).to(self.gpt.config.params_dtype)
            state["output_layer.bias"] = hf_state.get("score.bias", torch.zeros(1)).to(
                self.gpt.config.params_dtype
            )
        missing, unexpected = self.gpt.load_state_dict(state, strict=False)
        missing = [k for k in missing if "_extra_state" not in k]
        if missing or unexpected:
            raise RuntimeError(
                f"loading {path} into the Megatron model: missing {missing}, unexpected {unexpected}"
            )

    def _wrap(self) -> Any:
        """The model in megatron-core's (untyped) ``DistributedDataParallel``."""
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )

        module: torch.nn.Module = self.gpt
        if self.half is not None:
            from megatron.core.transformer.module import Float16Module

            module = Float16Module(self.gpt.config, self.gpt)
        ddp = self.mcfg.distributed_data_parallel_config
        on_gpu = torch.cuda.is_available()
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=ddp.grad_reduce_in_fp32,
            # Overlap needs CUDA streams; gloo gives nothing to overlap with on CPU.
            overlap_grad_reduce=ddp.overlap_grad_reduce and on_gpu,
            overlap_param_gather=ddp.overlap_param_gather and on_gpu,
            # gloo has no AVG reduction; 1/dp scaling before a SUM is the same average.
            average_in_collective=ddp.average_in_collective and on_gpu,
            use_distributed_optimizer=self.mcfg.optimizer.use_distributed_optimizer,
        )
        with cuda_as_cpu():
            model = DistributedDataParallel(
                config=self.gpt.config, ddp_config=ddp_config, module=module
            )
        # The schedule reduces gradients over data-parallel ranks only through these hooks.
        self.gpt.config.no_sync_func = model.no_sync
        self.gpt.config.finalize_model_grads_func = finalize_model_grads
        return model

    def _build_optimizer(self) -> None:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        opt = self.mcfg.optimizer
        sched = self.mcfg.scheduler
        config = OptimizerConfig(
            optimizer=opt.optimizer,
            lr=opt.lr,
            min_lr=opt.min_lr,
            weight_decay=opt.weight_decay,
            bf16=opt.bf16,
            fp16=opt.fp16,
            params_dtype=DTYPES[opt.params_dtype],
            adam_beta1=opt.adam_beta1,
            adam_beta2=opt.adam_beta2,
            adam_eps=opt.adam_eps,
            sgd_momentum=opt.sgd_momentum,
            use_distributed_optimizer=opt.use_distributed_optimizer,
            # The precision-aware path needs TE's FusedAdam.
            use_precision_aware_optimizer=opt.use_precision_aware_optimizer and self.use_te,
            clip_grad=opt.clip_grad or 0.0,
            # Host memory is where everything already is without CUDA: nothing to offload.
            optimizer_cpu_offload=opt.optimizer_cpu_offload and torch.cuda.is_available(),
            optimizer_offload_fraction=opt.optimizer_offload_fraction,
        )
        self._optimizer_on_host = config.optimizer_cpu_offload
        with cuda_as_cpu():
            self.optimizer = get_megatron_optimizer(config, [self.model])
        start_wd, end_wd = self.mcfg.weight_decay_range
        decay_iters = sched.lr_decay_iters or 1
        self.scheduler = OptimizerParamScheduler(
            self.optimizer,
            init_lr=sched.lr_warmup_init,
            max_lr=opt.lr,
            min_lr=opt.min_lr,
            lr_warmup_steps=sched.lr_warmup_iters,
            lr_decay_steps=max(decay_iters, sched.lr_warmup_iters + 1),
            lr_decay_style=sched.lr_decay_style,
            start_wd=start_wd,
            end_wd=end_wd,
            wd_incr_steps=max(decay_iters, 1),
            wd_incr_style=sched.weight_decay_incr_style,
            wsd_decay_steps=sched.lr_wsd_decay_iters,
            lr_wsd_decay_style=sched.lr_wsd_decay_style,
        )

    # ---- data ---------------------------------------------------------------------------

    def result_rank(self) -> bool:
        """Whether the driver keeps this rank's results (TP rank 0 of each DP rank)."""
        return self.tp_rank == 0

    def _dp_share(self, data: BatchedDataDict) -> BatchedDataDict:
        bounds = torch.tensor_split(torch.arange(data.size), self.dp_size)[self.dp_rank]
        if not len(bounds):
            return data.slice(0, 0)
        return data.slice(int(bounds[0]), int(bounds[-1]) + 1)

    def _forward(self, mb: BatchedDataDict) -> tuple[torch.Tensor, ForwardLayout]:
        """Row-layout float32 output (temperature-scaled logits, or values) and its layout."""
        layout = padded_layout(
            mb["input_ids"], mb["input_lengths"], self.cfg.make_sequence_length_divisible_by
        )
        device = "cuda" if torch.cuda.is_available() else "cpu"
        out = self.model(layout.input_ids.to(device), layout.position_ids.to(device), None)
        if self.spec.head == "value":
            # Position t holds the value of the state before token t: hidden state t-1.
            return torch.nn.functional.pad(out.squeeze(-1).float()[:, :-1], (1, 0)), layout
        return out[..., : self.layout.vocab_size].float() / self.temperature, layout

    def _microbatches(
        self, share: BatchedDataDict, mbs: int, train: bool
    ) -> tuple[list[BatchedDataDict], list[int] | None]:
        """This rank's microbatches of ``share``: ``mbs`` samples each, or with
        ``dynamic_batching`` NeMo RL's token-budget plan (sorted by length, each cut to its
        rounded width), and then the order that undoes the sort."""
        dynamic = self.cfg.dynamic_batching
        if not dynamic.enabled or not share.size:
            return list(share.make_microbatch_iterator(mbs)), None
        budget = dynamic.train_mb_tokens if train else dynamic.logprob_mb_tokens
        args = DynamicBatchingArgs(
            max_tokens_per_microbatch=filled(budget, "dynamic_batching.*_mb_tokens"),
            sequence_length_round=dynamic.sequence_length_round,
            input_key="input_ids",
            input_lengths_key="input_lengths",
        )
        [planned], order = share.shard_by_batch_size(1, None, dynamic_batching_args=args)
        return list(planned.make_microbatch_iterator_with_dynamic_shapes()), order

    # ---- inference ----------------------------------------------------------------------

    def _inference_plan(
        self, data: BatchedDataDict, micro_batch_size: int | None
    ) -> tuple[list[BatchedDataDict], list[int] | None]:
        """This rank's share of ``data`` in inference microbatches, and their order."""
        self.onload(optimizer=False)
        self.model.eval()
        mbs = micro_batch_size or filled(self.cfg.logprob_batch_size, "policy.logprob_batch_size")
        return self._microbatches(self._dp_share(data), mbs, train=False)

    def _inference(
        self, microbatches: list[BatchedDataDict]
    ) -> Iterator[tuple[torch.Tensor, ForwardLayout]]:
        """(row-layout output, layout) per microbatch, without grad."""
        with torch.no_grad():
            for mb in microbatches:
                yield self._forward(mb)

    @staticmethod
    def _assembled(
        parts: list[torch.Tensor], order: list[int] | None, shape: tuple[int, ...]
    ) -> torch.Tensor:
        """The microbatches' outputs as one ``[B_local, *shape]`` tensor in the share's order:
        each right-padded to ``shape``'s width (a dynamic microbatch is cut to its own), the
        length sort undone."""
        if not parts:
            return torch.zeros(0, *shape)
        padding = [(0, 0) * (part.dim() - 2) + (0, shape[0] - part.shape[1]) for part in parts]
        joined = torch.cat(
            [torch.nn.functional.pad(part, pad) for part, pad in zip(parts, padding, strict=True)]
        )
        if order is None:
            return joined
        restored = torch.empty_like(joined)
        restored[torch.tensor(order)] = joined
        return restored

    def get_logprobs(self, data: BatchedDataDict, micro_batch_size: int | None) -> torch.Tensor:
        """``[B_local, S]`` next-token logprobs of this rank's share (position 0 and padding 0)."""
        microbatches, order = self._inference_plan(data, micro_batch_size)
        parts = []
        for logits, layout in self._inference(microbatches):
            shifted = next_token_logprobs_from_logits(logits, layout.input_ids.to(logits.device))
            parts.append(layout.unpack(torch.nn.functional.pad(shifted, (1, 0)).cpu()))
        return self._assembled(parts, order, (data["input_ids"].shape[1],))

    def get_reference_policy_logprobs(
        self, data: BatchedDataDict, micro_batch_size: int | None
    ) -> torch.Tensor:
        """Logprobs under the base weights, swapped in for the call (as NeMo RL does)."""
        if self.reference_state is None:
            raise RuntimeError(
                "this policy was built with init_reference_model=False; it has no reference model"
            )
        self.onload(optimizer=False)
        current = self._weights_snapshot()
        self.gpt.load_state_dict(self.reference_state, strict=False)
        self._empty_unused_memory(1)
        try:
            return self.get_logprobs(data, micro_batch_size)
        finally:
            self.gpt.load_state_dict(current, strict=False)
            self._empty_unused_memory(1)

    def get_topk_logits(
        self, data: BatchedDataDict, k: int, micro_batch_size: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``k`` logits and token ids for the next token, ``[B_local, S-1, k]``."""
        microbatches, order = self._inference_plan(data, micro_batch_size)
        values, indices = [], []
        for logits, layout in self._inference(microbatches):
            top = torch.topk(logits, k, dim=-1)
            values.append(layout.unpack(top.values.cpu())[:, :-1])
            indices.append(layout.unpack(top.indices.cpu())[:, :-1])
        shape = (data["input_ids"].shape[1] - 1, k)
        return self._assembled(values, order, shape), self._assembled(indices, order, shape).long()

    def get_values(self, data: BatchedDataDict, micro_batch_size: int | None) -> torch.Tensor:
        """``[B_local, S]`` values of this rank's share (zero at position 0 and past the length)."""
        microbatches, order = self._inference_plan(data, micro_batch_size)
        parts = [layout.unpack(v.cpu()) for v, layout in self._inference(microbatches)]
        return self._assembled(parts, order, (data["input_ids"].shape[1],))

    # ---- training -----------------------------------------------------------------------

    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool,
        gbs: int | None,
        mbs: int | None,
    ) -> dict[str, Any]:
        """This rank's part of one optimizer step per global batch; losses are local sums."""
        gbs = gbs or self.cfg.train_global_batch_size
        mbs = mbs or self.cfg.train_micro_batch_size
        if data.size % gbs:
            raise ValueError(f"train data has {data.size} samples, not a multiple of gbs={gbs}")
        if self.cfg.dynamic_batching.enabled and gbs % self.dp_size:
            raise ValueError(
                f"policy.train_global_batch_size={gbs} must be a multiple of data-parallel size "
                f"{self.dp_size}"
            )
        if not self.cfg.dynamic_batching.enabled and gbs % (self.dp_size * mbs):
            raise ValueError(
                f"policy.train_global_batch_size={gbs} must be a multiple of data-parallel size "
                f"{self.dp_size} x policy.train_micro_batch_size={mbs}"
            )
        if not eval_mode and self.optimizer is None:
            raise RuntimeError("this model was built with init_optimizer=False; it cannot train")
        if "sample_mask" not in data:
            data = BatchedDataDict({**data, "sample_mask": torch.ones(data.size)})
        self.onload(optimizer=True)
        self.model.train(not eval_mode)
        losses, grad_norms = [], []
        all_mb_metrics: dict[str, list[Any]] = defaultdict(list)
        for gb_idx in range(data.size // gbs):
            batch = data.get_batch(gb_idx, gbs)
            loss = self._forward_backward(batch, loss_fn, eval_mode, mbs, all_mb_metrics)
            self._empty_unused_memory(1)
            self._check_finite(loss, gb_idx)
            if not eval_mode:
                with cuda_as_cpu():
                    _, grad_norm, _ = self.optimizer.step()
                grad_norms.append(float(grad_norm))
                self._empty_unused_memory(2)
            losses.append(float(loss))
        if not eval_mode:
            self.scheduler.step(increment=1)
        return {
            "loss": torch.tensor(losses),
            "grad_norm": torch.tensor(grad_norms),
            "lr": self.current_lr(),
            "all_mb_metrics": dict(all_mb_metrics),
        }

    def _forward_backward(
        self,
        batch: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool,
        mbs: int,
        all_mb_metrics: dict[str, list[Any]],
    ) -> torch.Tensor:
        """Megatron's schedule over this rank's microbatches; returns the summed local loss."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        seqs, toks = calculate_global_valid_counts(batch)
        microbatches, _ = self._microbatches(self._dp_share(batch), mbs, train=True)
        num_mb = len(microbatches)
        mb_losses: list[torch.Tensor] = []

        def loss_func(mb: BatchedDataDict, output: torch.Tensor) -> tuple[torch.Tensor, dict]:
            loss_input, mb = prepare_loss_input(output, mb, loss_fn)
            loss, metrics = loss_fn(
                data=mb, global_valid_seqs=seqs, global_valid_toks=toks, **loss_input
            )
            mb_losses.append(loss.detach())
            metrics = {k: _as_metric(v) for k, v in metrics.items()}
            metrics.update(
                lr=self.current_lr(), global_valid_seqs=seqs.item(), global_valid_toks=toks.item()
            )
            for key, value in metrics.items():
                all_mb_metrics[key].append(value)
            # Undo the schedule's 1/num_microbatches and DDP's 1/dp averaging.
            return loss * num_mb * self.dp_size, {}

        def forward_step(data_iterator: Iterator[BatchedDataDict], model: Any) -> Any:
            mb = next(data_iterator)
            output, layout = self._forward(mb)
            return layout.unpack(output), partial(loss_func, mb.to(output.device))

        if not eval_mode:
            self.model.zero_grad_buffer()
            self.optimizer.zero_grad()
        with torch.set_grad_enabled(not eval_mode):
            get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(microbatches),
                model=self.model,
                num_microbatches=num_mb,
                seq_length=batch["input_ids"].shape[1],
                micro_batch_size=mbs,
                forward_only=eval_mode,
            )
        return torch.stack(mb_losses).sum().float().reshape(1)

    def _check_finite(self, local_loss: torch.Tensor, gb_idx: int) -> None:
        """Every DP rank must agree to skip the step, or the next collective would hang."""
        from megatron.core import parallel_state

        bad = (~torch.isfinite(local_loss)).float()
        dist.all_reduce(bad, group=parallel_state.get_data_parallel_group())
        if bad.item():
            if self.optimizer is not None:
                self.model.zero_grad_buffer()
                self.optimizer.zero_grad()
            raise NonFiniteLossError(
                f"loss is not finite at global batch {gb_idx}; the optimizer step was skipped. "
                "Lower the learning rate or check the rewards/advantages for NaN"
            )

    def _empty_unused_memory(self, level: int) -> None:
        """``megatron_cfg.empty_unused_memory_level`` as NeMo RL's worker: from level 1 the
        CUDA allocator's unused blocks go back after each forward-backward and reference-weight
        swap, from level 2 after each optimizer step too (nothing to do without CUDA)."""
        if self.mcfg.empty_unused_memory_level >= level and torch.cuda.is_available():
            gc.collect()
            torch.cuda.empty_cache()

    def current_lr(self) -> float:
        if self.optimizer is None:
            return 0.0
        return float(self.optimizer.param_groups[0]["lr"])

    # ---- device memory between steps ----------------------------------------------------

    def offload(self, weights: bool) -> None:
        """The gradient buffers and the optimizer state out of device memory (NeMo RL's
        ``offload_before_refit``), with ``weights`` the parameters and the reference weights
        too (``offload_after_refit``). The next pass brings back what it needs."""
        weight_storages = distinct_storages(self._weight_tensors())
        if self.optimizer is not None and not self._optimizer_on_host:
            optimizer = distinct_storages(self._optimizer_tensors(), besides=weight_storages)
            self._parked_optimizer.park(optimizer)
        self._parked_grads.park(distinct_storages(self._grad_buffers()))
        if weights:
            self._parked_weights.park(weight_storages)
        if torch.cuda.is_available():
            release_device_memory()

    def onload(self, optimizer: bool) -> None:
        """The weights back in device memory; with ``optimizer`` the gradient buffers and the
        optimizer state too (training needs them, logprobs do not)."""
        self._parked_weights.restore()
        if optimizer:
            self._parked_grads.restore()
            self._parked_optimizer.restore()

    def _weight_tensors(self) -> list[torch.Tensor]:
        reference = list(self.reference_state.values()) if self.reference_state else []
        return [*self.model.parameters(), *reference]

    def _grad_buffers(self) -> list[torch.Tensor]:
        """Megatron DDP's contiguous gradient buffers (every ``main_grad`` is a view)."""
        buffers = [*self.model.buffers, *self.model.expert_parallel_buffers]
        return [buffer.grad_data for buffer in buffers if buffer.grad_data is not None]

    def _optimizer_tensors(self) -> list[torch.Tensor]:
        """The torch optimizers' parameters (fp32 main copies, or views of the weights) and
        per-parameter state."""
        tensors: list[torch.Tensor] = []
        for opt in self._torch_optimizers():
            for group in opt.optimizer.param_groups:
                tensors += group["params"]
            for state in opt.optimizer.state.values():
                tensors += [value for value in state.values() if isinstance(value, torch.Tensor)]
        return tensors

    # ---- checkpoints --------------------------------------------------------------------

    def _gathered_hf_state(self) -> dict[str, torch.Tensor] | None:
        """The full HF state dict on TP rank 0 (None elsewhere), gathered over the TP group."""
        from megatron.core import parallel_state

        self.onload(optimizer=False)
        local = {k: v.cpu() for k, v in self._weights_snapshot().items()}
        shards: list[dict[str, torch.Tensor]] = [local]
        if self.tp > 1:
            group = parallel_state.get_tensor_model_parallel_group()
            gathered: list[Any] | None = [None] * self.tp if self.tp_rank == 0 else None
            dst = dist.get_global_rank(group, 0)
            dist.gather_object(local, gathered, dst=dst, group=group)
            shards = gathered or []
        if self.tp_rank != 0:
            return None
        if self.spec.head == "value":
            head = {"score.weight": shards[0].pop("output_layer.weight")}
            head["score.bias"] = shards[0].pop("output_layer.bias")
            for shard in shards[1:]:
                shard.pop("output_layer.weight")
                shard.pop("output_layer.bias")
            return {**megatron_to_hf(shards, self._lm_layout(), fused_norms=self.use_te), **head}
        return megatron_to_hf(shards, self.layout, fused_norms=self.use_te)

    def _lm_layout(self) -> GPTLayout:
        """The value model's trunk has no LM head, whatever the HF config says about tying."""
        from dataclasses import replace

        return replace(self.layout, tied_embeddings=True)

    def hf_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Full HF-named weights on TP rank 0 of each DP rank (a collective over TP)."""
        return self._gathered_hf_state()

    def vocab_size(self) -> int:
        return self.layout.vocab_size

    def save_checkpoint(self, weights_path: str, optimizer_path: str | None) -> None:
        """HF safetensors + config and every rank's optimizer state, written by rank 0."""
        state = self._gathered_hf_state()  # None except on TP rank 0
        if self.dp_rank == 0 and state is not None:
            self._write_hf(Path(weights_path), state)
        if optimizer_path is not None:
            self.save_optimizer(optimizer_path)
        dist.barrier()

    def _write_hf(self, path: Path, state: dict[str, torch.Tensor]) -> None:
        """Weights in ``policy.precision``, with the base model's config and generation config."""
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        dtype = DTYPES.get(self.cfg.precision, torch.float32)
        save_file(
            {k: v.to(dtype).contiguous() for k, v in state.items()},
            str(path / "model.safetensors"),
            metadata={"format": "pt"},
        )
        config = copy.deepcopy(self.hf_config)
        if self.spec.head == "value":
            config.num_labels = 1
            config.architectures = [
                arch.replace("ForCausalLM", "ForTokenClassification")
                for arch in config.architectures or []
            ]
        config.save_pretrained(path)
        generation_config = Path(self.spec.model_path) / "generation_config.json"
        if generation_config.is_file():
            (path / "generation_config.json").write_text(generation_config.read_text())

    def _optimizer_file(self, optimizer_path: str) -> Path:
        return Path(optimizer_path) / f"optim_tp{self.tp_rank}_dp{self.dp_rank}.pt"

    def _torch_optimizers(self) -> list[Any]:
        """The megatron optimizers under the chain (one per parameter-group family)."""
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def save_optimizer(self, optimizer_path: str) -> None:
        """Per rank: the torch optimizer state and fp32 main params of this rank's shard, and
        the scheduler. (megatron's ``save_parameter_state`` assumes TE/apex Adam, whose state
        has no per-parameter ``step``; torch's AdamW, the fallback without them, has one.)"""
        if self.optimizer is None:
            raise RuntimeError("no optimizer to save (built with init_optimizer=False)")
        self.onload(optimizer=True)
        inner = [
            {
                "state": opt.optimizer.state_dict(),
                "main_params": [
                    p.detach().clone() for g in opt.optimizer.param_groups for p in g["params"]
                ],
            }
            for opt in self._torch_optimizers()
        ]
        state = {"optimizers": inner, "scheduler": self.scheduler.state_dict()}
        # Rank 0 writes every rank's file: the ranks of a stage run across machines do not
        # share the folder the checkpoint is committed from.
        files: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object((self._optimizer_file(optimizer_path).name, state), files, dst=0)
        for name, rank_state in files or []:
            path = Path(optimizer_path) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(rank_state, path)

    def load_optimizer(self, optimizer_path: str) -> None:
        if self.optimizer is None:
            raise RuntimeError(
                f"optimizer_path={optimizer_path} was given with init_optimizer=False; "
                "pass one or the other"
            )
        path = self._optimizer_file(optimizer_path)
        if not path.is_file():
            raise FileNotFoundError(
                f"optimizer checkpoint {optimizer_path} has no {path.name}; it was saved with "
                "another tensor/data-parallel layout than this model's"
            )
        saved = torch.load(path, weights_only=False)
        self.onload(optimizer=True)
        for opt, state in zip(self._torch_optimizers(), saved["optimizers"], strict=True):
            opt.optimizer.load_state_dict(state["state"])
            params = [p for g in opt.optimizer.param_groups for p in g["params"]]
            with torch.no_grad():
                for param, value in zip(params, state["main_params"], strict=True):
                    param.copy_(value)
        self.scheduler.load_state_dict(saved["scheduler"])
