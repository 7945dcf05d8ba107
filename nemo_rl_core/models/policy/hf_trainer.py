"""The training engine shared by the HF policy and the HF value model.

One torch module, its optimizer and LR schedule, microbatching (fixed, dynamic or packed)
and NeMo RL's train step: per global batch, gradients are accumulated over microbatches
whose losses are normalised by the *global* valid sequence/token counts, so any split
into microbatches gives the same update. Subclasses say how a microbatch becomes the
loss function's keyword inputs.
"""

import contextlib
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from nemo_rl_core.algorithms.loss.interfaces import LossFunction
from nemo_rl_core.algorithms.utils import calculate_global_valid_counts
from nemo_rl_core.distributed.batched_data_dict import (
    BatchedDataDict,
    DynamicBatchingArgs,
    SequencePackingArgs,
)
from nemo_rl_core.distributed.world import is_distributed, is_writer, rank_device
from nemo_rl_core.models.policy.config import TrainedModelConfig
from nemo_rl_core.models.policy.forward_layout import ForwardLayout, packed_layout, padded_layout
from nemo_rl_core.models.policy.hf_loading import check_vocab, embedding_rows
from nemo_rl_core.models.policy.offload import (
    HOST,
    move_module,
    move_optimizer_state,
    release_device_memory,
)
from nemo_rl_core.models.policy.optim import build_optimizer, build_scheduler
from nemo_rl_core.models.policy.utils import check_model_inputs
from nemo_rl_core.utils.config import filled
from nemo_rl_core.utils.timer import Timer

if TYPE_CHECKING:  # peft loads only where LoRA is used, FSDP/TP only across ranks
    from peft import PeftModel

    from nemo_rl_core.models.policy.sharding import Sharding

OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"


class NonFiniteTrainingError(FloatingPointError):
    """A loss or gradient norm was NaN/Inf; the optimizer step was skipped."""


def _pad_seq_dim(outputs: dict[str, torch.Tensor], missing: int) -> dict[str, torch.Tensor]:
    """Right-pad dim 1 of each output by ``missing`` (a dynamic microbatch is cut short)."""
    if missing <= 0:
        return outputs
    return {
        key: torch.nn.functional.pad(value, (0, 0) * (value.dim() - 2) + (0, missing))
        if value.dim() >= 2
        else value
        for key, value in outputs.items()
    }


def _as_metric(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    return value


class HFTrainable(ABC):
    """A single-process model with NeMo RL's microbatched train step and checkpointed optimizer."""

    def __init__(
        self,
        model: "PreTrainedModel | PeftModel",
        tokenizer: PreTrainedTokenizerBase,
        config: TrainedModelConfig,
        init_optimizer: bool,
        optimizer_path: str | Path | None,
    ) -> None:
        check_vocab(tokenizer, model)
        self.tokenizer = tokenizer
        self.cfg = config
        distributed = is_distributed()
        self.device = (
            rank_device()
            if distributed
            else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        )
        # transformers' @wraps(Module.to) types ``self`` as the first argument.
        self.model = model.to(self.device)  # type: ignore[arg-type]
        self.weights_offloaded = False  # in host memory while a colocated engine runs
        if config.dtensor_cfg.activation_checkpointing:
            # Recomputes each layer's activations in backward: less memory, same gradients.
            # Non-reentrant, so layers whose inputs need no grad (frozen LoRA bases) still
            # give their adapters gradients.
            self.model.gradient_checkpointing_enable({"use_reentrant": False})
        self.vocab_size = embedding_rows(self.model)
        # One rank of a training stage's world: FSDP2 (+TP) over its ranks (``sharding``).
        self.sharding: Sharding | None = self._shard() if distributed else None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: LRScheduler | None = None
        if init_optimizer:
            trainable = self._trainable_parameters()
            self.optimizer = build_optimizer(
                trainable, filled(config.optimizer, "policy.optimizer")
            )
            self.scheduler = build_scheduler(self.optimizer, config.scheduler)
        if optimizer_path is not None:
            self.load_optimizer(optimizer_path)

    def _shard(self) -> "Sharding":
        from nemo_rl_core.models.policy.sharding import shard_model

        if not isinstance(self.model, PreTrainedModel):  # peft's LoRA wrapper
            raise NotImplementedError(
                "dtensor_cfg.lora_cfg.enabled trains in one process here; set "
                "cluster.num_nodes=1 and cluster.gpus_per_node<=1 to train LoRA adapters"
            )
        dtensor = self.cfg.dtensor_cfg
        return shard_model(
            self.model,
            dtensor.tensor_parallel_size,
            dtensor.custom_parallel_plan,
            self.device,
            dtensor.dp_replicate_size,
            dtensor.sequence_parallel,
        )

    @property
    def dp_size(self) -> int:
        return 1 if self.sharding is None else self.sharding.dp_size

    def _trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer updates and the gradient clipping measures (a subclass may
        train more beside the model: the policy's draft head)."""
        return [p for p in self.model.parameters() if p.requires_grad]

    @abstractmethod
    def _loss_inputs(
        self, mb: BatchedDataDict, layout: ForwardLayout, loss_fn: LossFunction
    ) -> dict[str, torch.Tensor]:
        """Run the forward pass on ``layout`` and return the loss function's keyword inputs."""

    # ---- residency: the GPU lent to a colocated generation engine between steps --------

    def _resident_modules(self) -> list[torch.nn.Module]:
        """What leaves the device with the weights (a subclass adds what it keeps beside)."""
        return [self.model]

    def offload(self, weights: bool) -> None:
        """The optimizer state, and with ``weights`` the model, into host memory."""
        if self.device.type == "cpu":
            return
        if self.optimizer is not None:
            move_optimizer_state(self.optimizer, HOST)
        if weights:
            for module in self._resident_modules():
                move_module(module, HOST)
            self.weights_offloaded = True
        release_device_memory()

    def onload(self, optimizer: bool) -> None:
        """The model, and with ``optimizer`` its state, back on the device (no-ops where
        they are already there), so any pass after an offload runs without a prepare call."""
        if self.weights_offloaded:
            for module in self._resident_modules():
                move_module(module, self.device)
            self.weights_offloaded = False
        if optimizer and self.optimizer is not None and self.device.type != "cpu":
            move_optimizer_state(self.optimizer, self.device)

    # ---- inputs and microbatches -------------------------------------------------------

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 compute over float32 master weights when ``precision: bfloat16``."""
        return torch.autocast(
            self.device.type,
            dtype=torch.bfloat16,
            enabled=self.cfg.precision == "bfloat16",
        )

    def check_inputs(self, data: BatchedDataDict) -> None:
        check_model_inputs(data, self.cfg.max_total_sequence_length, self.vocab_size)

    def layout(self, mb: BatchedDataDict, packed: bool) -> ForwardLayout:
        """Padded rows, or one packed row when ``sequence_packing`` is on."""
        ids, lengths = mb["input_ids"], mb["input_lengths"]
        multiple = self.cfg.make_sequence_length_divisible_by
        if packed:
            return packed_layout(
                ids, lengths, multiple, self.cfg.sequence_packing.sequence_length_round
            )
        return padded_layout(ids, lengths, multiple)

    def forward(
        self,
        layout: ForwardLayout,
        model: torch.nn.Module | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """``model``'s (default: the trained one) raw output for a layout."""

        def on_device(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(self.device)

        with self.autocast():
            return (model or self.model)(
                input_ids=on_device(layout.input_ids),
                attention_mask=on_device(layout.attention_mask),
                position_ids=on_device(layout.position_ids),
                use_cache=False,
                output_hidden_states=output_hidden_states,
            )

    def plan(
        self, data: BatchedDataDict, batch_size: int | None, train: bool
    ) -> tuple[BatchedDataDict, list[int] | None]:
        """``data`` with NeMo RL's token-budget microbatch plan attached (dynamic batching or
        packing, sorted within each global batch), and the order that undoes the sort (over
        every shard's samples, shard after shard). On several data-parallel ranks: this
        rank's shard of every global batch (training) or of all of ``data`` (inference); the
        plans give every shard as many microbatches, so the ranks' collectives pair up."""
        dynamic, packing = self.cfg.dynamic_batching, self.cfg.sequence_packing
        shards = self.dp_size
        index = self.sharding.dp_rank if self.sharding is not None else 0
        if dynamic.enabled:
            dynamic_args = DynamicBatchingArgs(
                max_tokens_per_microbatch=filled(
                    dynamic.train_mb_tokens if train else dynamic.logprob_mb_tokens,
                    "policy.dynamic_batching.*_mb_tokens",
                ),
                sequence_length_round=dynamic.sequence_length_round,
                input_key="input_ids",
                input_lengths_key="input_lengths",
            )
            parts, order = data.shard_by_batch_size(
                shards, batch_size, dynamic_batching_args=dynamic_args
            )
        elif packing.enabled:
            packing_args = SequencePackingArgs(
                max_tokens_per_microbatch=filled(
                    packing.train_mb_tokens if train else packing.logprob_mb_tokens,
                    "policy.sequence_packing.*_mb_tokens",
                ),
                input_key="input_ids",
                input_lengths_key="input_lengths",
                algorithm=packing.algorithm,
                sequence_length_pad_multiple=self.cfg.make_sequence_length_divisible_by,
            )
            parts, order = data.shard_by_batch_size(
                shards, batch_size, sequence_packing_args=packing_args
            )
        elif shards > 1:
            return data.shard_by_batch_size(shards, batch_size)[index], None
        else:
            return data, None
        return parts[index], order

    def microbatches(self, batch: BatchedDataDict, mbs: int) -> Iterator[BatchedDataDict]:
        """A planned global batch's token-budget microbatches, else ``mbs`` samples each."""
        if self.cfg.dynamic_batching.enabled:
            return batch.make_microbatch_iterator_with_dynamic_shapes()
        if self.cfg.sequence_packing.enabled:
            return batch.make_microbatch_iterator_for_packable_sequences()
        return batch.make_microbatch_iterator(mbs)

    @torch.no_grad()
    def map_microbatches(
        self,
        data: BatchedDataDict,
        mbs: int | None,
        model: torch.nn.Module,
        per_mb: Callable[[ForwardLayout], dict[str, torch.Tensor]],
    ) -> BatchedDataDict:
        """Inference over ``data`` in microbatches (``logprob_batch_size`` or the token budget);
        results come back in ``data``'s order and width. On several data-parallel ranks each
        computes its shard of ``data`` (padded with copies of its last sample to a multiple
        of the ranks, so that every shard has as many samples) and every rank gets all the
        results, as NeMo RL's workers split inference over data-parallel ranks."""
        self.check_inputs(data)
        self.onload(optimizer=False)
        size = data.size
        if self.dp_size > 1 and size % self.dp_size:
            copies = data.select_indices([size - 1] * (self.dp_size - size % self.dp_size))
            data = BatchedDataDict.from_batches([data, copies])
        planned, order = self.plan(data, None, train=False)
        width = data["input_ids"].shape[1]
        was_training = model.training
        model.eval()
        try:
            outputs = [
                _pad_seq_dim(
                    per_mb(self.layout(mb, self.cfg.sequence_packing.enabled)),
                    width - mb["input_ids"].shape[1],
                )
                for mb in self.microbatches(
                    planned, mbs or filled(self.cfg.logprob_batch_size, "policy.logprob_batch_size")
                )
            ]
        finally:
            model.train(was_training)
        result: BatchedDataDict[Any] = BatchedDataDict.from_batches(outputs)
        if self.sharding is not None and self.dp_size > 1:
            shards: list[Any] = [None] * self.dp_size
            torch.distributed.all_gather_object(shards, result, group=self.sharding.dp_group)
            result = BatchedDataDict.from_batches(shards)
        if order is not None:
            result.reorder_data(order)
        return result if result.size == size else result.slice(0, size)

    # ---- training ---------------------------------------------------------------------

    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Timer | None = None,
    ) -> dict[str, Any]:
        """One optimizer step per global batch of ``gbs`` samples; the LR schedule steps once."""
        self.onload(optimizer=True)
        with timer.time("train") if timer is not None else contextlib.nullcontext():
            return self._train(data, loss_fn, eval_mode, gbs, mbs)

    def _train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool,
        gbs: int | None,
        mbs: int | None,
    ) -> dict[str, Any]:
        gbs = gbs or self.cfg.train_global_batch_size
        mbs = mbs or self.cfg.train_micro_batch_size
        self.check_inputs(data)
        if data.size % gbs:
            raise ValueError(f"train data has {data.size} samples, not a multiple of gbs={gbs}")
        if gbs % self.dp_size:
            raise ValueError(
                f"global batch size {gbs} (policy.train_global_batch_size) must be a multiple "
                f"of the data-parallel size {self.dp_size} (training world size / "
                "dtensor_cfg.tensor_parallel_size)"
            )
        if not eval_mode:
            self._optimizers("this model was built with init_optimizer=False; it cannot train")
        if "sample_mask" not in data:
            data = BatchedDataDict({**data, "sample_mask": torch.ones(data.size)})
        planned, _ = self.plan(data, gbs, train=True)
        self.model.train(not eval_mode)
        losses: list[float] = []
        grad_norms: list[float] = []
        total_seqs = total_toks = 0.0
        mb_metrics: list[tuple[int, dict[str, Any]]] = []  # (global batch, its metrics)
        clear_every = self.cfg.dtensor_cfg.clear_cache_every_n_steps
        for gb_idx in range(data.size // gbs):
            batch = planned.get_batch(gb_idx, gbs // self.dp_size)
            # normalised by the whole global batch's counts, whichever share this rank trains
            whole = batch if self.sharding is None else data.get_batch(gb_idx, gbs)
            seqs, toks = calculate_global_valid_counts(whole)
            total_seqs, total_toks = total_seqs + seqs.item(), total_toks + toks.item()
            gb_loss = 0.0
            if self.optimizer is not None:
                self.optimizer.zero_grad(set_to_none=True)
            for mb_idx, mb in enumerate(self.microbatches(batch, mbs)):
                if clear_every and mb_idx % clear_every == 0 and torch.cuda.is_available():
                    torch.cuda.empty_cache()  # NeMo RL's: every n-th microbatch of a batch
                # The layout is index bookkeeping on the CPU; forward() moves its inputs.
                layout = self.layout(mb, self.cfg.sequence_packing.enabled)
                mb = mb.to(self.device)
                with torch.set_grad_enabled(not eval_mode):
                    loss_inputs = self._loss_inputs(mb, layout, loss_fn)
                    loss, metrics = loss_fn(
                        data=mb, global_valid_seqs=seqs, global_valid_toks=toks, **loss_inputs
                    )
                # One rank alone must not stop: its peers would wait in the next collective.
                # Sharded, the global batch's summed loss is checked on every rank below.
                if self.sharding is None and not torch.isfinite(loss):
                    self._abort_step(
                        f"loss is {loss.item()} at global batch {gb_idx}, microbatch {mb_idx}"
                    )
                if not eval_mode:
                    # FSDP averages the ranks' gradients; their shares must add up instead
                    (loss if self.sharding is None else loss * self.dp_size).backward()
                gb_loss += loss.item()
                metrics = {k: _as_metric(v) for k, v in metrics.items()}
                metrics.update(
                    lr=self.current_lr(),
                    global_valid_seqs=seqs.item(),
                    global_valid_toks=toks.item(),
                )
                mb_metrics.append((gb_idx, metrics))
            if self.sharding is not None:
                gb_loss = self._summed_over_ranks(gb_loss, gb_idx)
            if not eval_mode:
                grad_norms.append(self._clip_and_step(gb_idx))
            losses.append(gb_loss)
        if not eval_mode:
            self._optimizers("no scheduler to step")[1].step()
        all_mb_metrics: dict[str, list[Any]] = defaultdict(list)
        for _, metrics in self._all_ranks_metrics(mb_metrics):
            for key, value in metrics.items():
                all_mb_metrics[key].append(value)
        return {
            "loss": torch.tensor(losses),
            "grad_norm": torch.tensor(grad_norms),
            "lr": self.current_lr(),
            "global_valid_seqs": total_seqs,
            "global_valid_toks": total_toks,
            "model_dtype": self.cfg.precision,
            "all_mb_metrics": dict(all_mb_metrics),
        }

    def _summed_over_ranks(self, local_loss: float, gb_idx: int) -> float:
        """The global batch's loss: the data-parallel ranks' shares added; a non-finite sum
        skips the step on every rank."""
        assert self.sharding is not None
        total = torch.tensor(local_loss, dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(total, group=self.sharding.dp_group)
        if not torch.isfinite(total):
            self._abort_step(f"loss is {total.item()} at global batch {gb_idx}")
        return float(total)

    def _all_ranks_metrics(
        self, mine: list[tuple[int, dict[str, Any]]]
    ) -> list[tuple[int, dict[str, Any]]]:
        """Every data-parallel rank's microbatch metrics, global batch by global batch and
        rank by rank: with contiguous shares, the one-process microbatch order."""
        if self.sharding is None:
            return mine
        gathered: list[Any] = [None] * self.sharding.dp_size
        torch.distributed.all_gather_object(gathered, mine, group=self.sharding.dp_group)
        ranked = [
            (gb, rank, i, m) for rank, part in enumerate(gathered) for i, (gb, m) in enumerate(part)
        ]
        return [(gb, m) for gb, _, _, m in sorted(ranked, key=lambda r: r[:3])]

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer else 0.0

    def _abort_step(self, what: str) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        raise NonFiniteTrainingError(
            f"{what}; the optimizer step was skipped and the weights are unchanged. "
            "Lower the learning rate, check the rewards/advantages for NaN, or set max_grad_norm"
        )

    def _clip_and_step(self, gb_idx: int) -> float:
        params = [p for p in self._trainable_parameters() if p.grad is not None]
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm is not None else math.inf
        if self.sharding is None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        else:
            grad_norm = self._clip_sharded(params, max_norm)
        if not math.isfinite(grad_norm):
            self._abort_step(f"gradient norm is {grad_norm} at global batch {gb_idx}")
        self._optimizers("no optimizer to step")[0].step()
        return grad_norm

    @staticmethod
    def _clip_sharded(params: list[torch.nn.Parameter], max_norm: float) -> float:
        """``clip_grad_norm_`` over shards: the global norm (a collective), then the same
        clamped coefficient on every local shard."""
        from nemo_rl_core.models.policy.sharding import grad_norm, scale_grads

        norm = grad_norm(params)
        if math.isfinite(norm):
            scale_grads(params, min(max_norm / (norm + 1e-6), 1.0))
        return norm

    def _optimizers(self, why: str) -> tuple[torch.optim.Optimizer, LRScheduler]:
        """The optimizer and its scheduler; both exist exactly with ``init_optimizer=True``."""
        if self.optimizer is None or self.scheduler is None:
            raise RuntimeError(why)
        return self.optimizer, self.scheduler

    # ---- checkpoints ------------------------------------------------------------------

    def save_checkpoint(
        self,
        weights_path: str | Path,
        optimizer_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
    ) -> None:
        """HF layout (config.json, model.safetensors, generation_config.json, tokenizer) and
        optimizer/scheduler state; the constructor's ``weights_path=``/``optimizer_path=``
        continue training bit-exactly from them.

        The optimizer state (twice the weights' size with Adam) is written on a second
        thread while the weights are: both only read, and the two writes overlap. Sharded,
        every rank must call it: the full tensors are gathered to rank 0, which writes the
        same layout one process writes (so any world size resumes from it).
        """
        if self.sharding is not None:
            self._save_sharded(weights_path, optimizer_path, tokenizer_path)
            return
        with ThreadPoolExecutor(max_workers=1) as pool:
            optimizer_saved = (
                pool.submit(self.save_optimizer, optimizer_path)
                if optimizer_path is not None
                else None
            )
            self._save_weights(weights_path)
            self.tokenizer.save_pretrained(str(weights_path))
            if tokenizer_path is not None:
                self.tokenizer.save_pretrained(str(tokenizer_path))
            if optimizer_saved is not None:
                optimizer_saved.result()

    def _save_sharded(
        self,
        weights_path: str | Path,
        optimizer_path: str | Path | None,
        tokenizer_path: str | Path | None,
    ) -> None:
        from nemo_rl_core.models.policy.sharding import full_model_state, full_optimizer_state

        weights = full_model_state(self.model)
        optimizer_state = (
            full_optimizer_state(self.model, self._optimizers("no optimizer to save")[0])
            if optimizer_path is not None
            else None
        )
        if not is_writer():
            return
        self.model.save_pretrained(str(weights_path), state_dict=weights)
        self.tokenizer.save_pretrained(str(weights_path))
        if tokenizer_path is not None:
            self.tokenizer.save_pretrained(str(tokenizer_path))
        if optimizer_path is not None:
            self._write_optimizer(Path(optimizer_path), optimizer_state)

    def _save_weights(self, path: str | Path) -> None:
        """The model in HF layout at ``path`` (a subclass may save more beside it)."""
        self.model.save_pretrained(str(path))

    def save_optimizer(self, optimizer_path: str | Path) -> None:
        """Optimizer and scheduler state, so a resumed run continues bit-exactly."""
        optimizer, _ = self._optimizers("no optimizer to save (built with init_optimizer=False)")
        self._write_optimizer(Path(optimizer_path), optimizer.state_dict())

    def _write_optimizer(self, path: Path, optimizer_state: Any) -> None:
        path.mkdir(parents=True, exist_ok=True)
        torch.save(optimizer_state, path / OPTIMIZER_FILE)
        torch.save(self._optimizers("no scheduler to save")[1].state_dict(), path / SCHEDULER_FILE)

    def load_optimizer(self, optimizer_path: str | Path) -> None:
        path = Path(optimizer_path)
        optimizer, scheduler = self._optimizers(
            f"optimizer_path={path} was given with init_optimizer=False; pass one or the other"
        )
        for name in (OPTIMIZER_FILE, SCHEDULER_FILE):
            if not (path / name).is_file():
                raise FileNotFoundError(f"optimizer checkpoint {path} has no {name}")
        if self.sharding is None:
            optimizer.load_state_dict(
                torch.load(path / OPTIMIZER_FILE, map_location=self.device, weights_only=True)
            )
        else:  # every rank reads the full state and keeps its shard
            from nemo_rl_core.models.policy.sharding import load_full_optimizer_state

            state = torch.load(path / OPTIMIZER_FILE, map_location="cpu", weights_only=True)
            load_full_optimizer_state(self.model, optimizer, state)
        scheduler.load_state_dict(torch.load(path / SCHEDULER_FILE, weights_only=True))
