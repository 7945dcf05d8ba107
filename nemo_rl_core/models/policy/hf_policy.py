"""A single-process HF/torch policy implementing NeMo RL's ``ColocatablePolicyInterface``.

It is NeMo RL's DTensor policy worker with one rank: float32 master weights (bf16 compute
under autocast with ``precision: bfloat16``), a frozen reference copy of the base model,
and checkpoints in HF safetensors layout that transformers and vLLM load directly.
Logits are divided by ``policy.generation.temperature`` before any logprob, as NeMo RL
does, so training logprobs match the sampler's processed logprobs. With
``policy.reward_model_cfg.enabled`` the model is a scalar-head reward model instead (HF
``*ForSequenceClassification``, one label), whose checkpoints
``AutoModelForSequenceClassification`` loads.
"""

import copy
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from nemo_rl_core.algorithms.loss.interfaces import LossFunction, LossInputType
from nemo_rl_core.algorithms.loss.utils import (
    next_token_logprobs_from_logits,
    prepare_loss_input,
    shift_left,
)
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.distributed.world import is_distributed
from nemo_rl_core.models.generation.interfaces import GenerationDatumSpec
from nemo_rl_core.models.policy.config import PolicyConfig
from nemo_rl_core.models.policy.draft import (
    DraftHead,
    DraftLossWrapper,
    build_draft_head,
    feature_layers,
    save_draft_head,
)
from nemo_rl_core.models.policy.forward_layout import ForwardLayout
from nemo_rl_core.models.policy.fp8_calibration import calibrate_qkv_scales
from nemo_rl_core.models.policy.hf_loading import load_pretrained, load_scalar_head, load_tokenizer
from nemo_rl_core.models.policy.hf_trainer import HFTrainable
from nemo_rl_core.models.policy.interfaces import (
    ColocatablePolicyInterface,
    LogprobOutputSpec,
    ReferenceLogprobOutputSpec,
    TopkLogitsOutputSpec,
)
from nemo_rl_core.models.policy.lora import add_adapters, merged_model, save_lora_checkpoint
from nemo_rl_core.models.policy.selected_logprobs import HeadSplits, selected_token_logprobs
from nemo_rl_core.models.policy.state_dict_refit import StateDictRefit
from nemo_rl_core.models.policy.utils import DTYPES
from nemo_rl_core.utils.config import filled


class HFPolicy(HFTrainable, StateDictRefit, ColocatablePolicyInterface):
    """NeMo RL's policy on one device with transformers models."""

    def __init__(
        self,
        config: PolicyConfig,
        tokenizer: PreTrainedTokenizerBase | None = None,
        weights_path: str | Path | None = None,
        optimizer_path: str | Path | None = None,
        init_optimizer: bool = True,
        init_reference_model: bool = True,
    ) -> None:
        tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        base = _load_model(config.model_name, config, tokenizer)
        # NeMo RL keeps the *base* model as reference, even when resuming from a checkpoint.
        self.reference_model = _frozen_copy(base) if init_reference_model else None
        self.lora = config.dtensor_cfg.lora_cfg
        model: PreTrainedModel | PeftModel = base
        if self.lora is not None and self.lora.enabled:
            model = add_adapters(base, self.lora, weights_path)
        elif weights_path is not None:
            model = _load_model(weights_path, config, tokenizer)
        # Built before the optimizer, which updates it with the model (policy.draft).
        self.draft: DraftHead | None = None
        if config.draft.enabled:
            if is_distributed():
                raise NotImplementedError(
                    "policy.draft.enabled trains beside a policy in one process here; set "
                    "cluster.num_nodes=1 and cluster.gpus_per_node<=1 to train a draft head"
                )
            self.draft = build_draft_head(config.draft, model.config, weights_path)
            self.draft_loss_weight = config.draft.loss_weight
            self.draft_layers = feature_layers(config.draft, model.config.num_hidden_layers)
        super().__init__(model, tokenizer, config, init_optimizer, optimizer_path)
        if self.draft is not None:
            self.draft.to(self.device)
        if self.reference_model is not None:
            self.reference_model.to(self.device)
        temperature = config.generation.temperature if config.generation else 1.0
        self.temperature = temperature if temperature > 0 else 1.0
        self.head_splits = HeadSplits()
        self.scalar_head = config.reward_model_cfg.enabled
        self.offload_optimizer_for_logprob = config.offload_optimizer_for_logprob

    # ---- inference --------------------------------------------------------------------

    def _logits(self, model: torch.nn.Module, layout: ForwardLayout) -> torch.Tensor:
        """Row-layout float32 logits, temperature-scaled."""
        return self.forward(layout, model).logits.float() / self.temperature

    def _next_token_logprobs(
        self, layout: ForwardLayout, model: torch.nn.Module, wanted: torch.Tensor
    ) -> torch.Tensor:
        """``[batch, seq-1]`` log p(token t+1 | <= t) where ``wanted``; 0 elsewhere.

        Only the wanted positions reach the LM head when the model splits into body and
        head (``selected_logprobs``); otherwise the full logits are unpacked and masked.
        """
        # Sharded, the root's FSDP hooks gather the head's weights only in model(...)
        split = self.head_splits(model) if self.sharding is None else None
        if split is None:
            logits = layout.unpack(self._logits(model, layout))
            ids = layout.unpack(layout.input_ids).to(logits.device)
            needed = wanted.bool().cpu() & layout.valid[:, 1:]
            return next_token_logprobs_from_logits(logits, ids) * needed.to(logits.device)
        body, head = split
        with self.autocast():
            hidden = self.forward(layout, body).last_hidden_state
            return selected_token_logprobs(hidden, head, layout, wanted, self.temperature)

    def _token_logprobs(self, layout: ForwardLayout, model: torch.nn.Module) -> torch.Tensor:
        """``[batch, seq]`` logprob of each token; position 0 and padding are 0."""
        shifted = self._next_token_logprobs(layout, model, layout.valid[:, 1:])
        return torch.nn.functional.pad(shifted, (1, 0)).cpu()

    def get_logprobs(
        self, data: BatchedDataDict[GenerationDatumSpec], micro_batch_size: int | None = None
    ) -> BatchedDataDict[LogprobOutputSpec]:
        """``logprobs [batch, seq]``: position t holds log p(token t | tokens < t); position 0 is 0."""
        return self.map_microbatches(
            data,
            micro_batch_size,
            self.model,
            lambda layout: {"logprobs": self._token_logprobs(layout, self.model)},
        )

    def get_reference_policy_logprobs(
        self, data: BatchedDataDict[GenerationDatumSpec], micro_batch_size: int | None = None
    ) -> BatchedDataDict[ReferenceLogprobOutputSpec]:
        """Logprobs under the frozen base model, as ``reference_logprobs``."""
        if self.reference_model is None:
            raise RuntimeError(
                "this policy was built with init_reference_model=False; rebuild it with "
                "init_reference_model=True to compute reference logprobs"
            )
        reference = self.reference_model
        return self.map_microbatches(
            data,
            micro_batch_size,
            reference,
            lambda layout: {"reference_logprobs": self._token_logprobs(layout, reference)},
        )

    def get_topk_logits(
        self,
        data: BatchedDataDict[GenerationDatumSpec],
        k: int,
        micro_batch_size: int | None = None,
    ) -> BatchedDataDict[TopkLogitsOutputSpec]:
        """Top-``k`` logits and token ids for the next token at positions 0..S-2 (S-1 positions)."""
        if not 1 <= k <= self.vocab_size:
            raise ValueError(f"k must be in [1, {self.vocab_size}] (vocab size), got {k}")

        def topk(layout: ForwardLayout) -> dict[str, torch.Tensor]:
            values, indices = self._logits(self.model, layout).topk(k, dim=-1)
            return {
                "topk_logits": layout.unpack(values)[:, :-1].cpu(),
                "topk_indices": layout.unpack(indices)[:, :-1].cpu(),
            }

        return self.map_microbatches(data, micro_batch_size, self.model, topk)

    # ---- training ---------------------------------------------------------------------

    def _trainable_parameters(self) -> list[torch.nn.Parameter]:
        draft = list(self.draft.parameters()) if self.draft is not None else []
        return [*super()._trainable_parameters(), *draft]

    def train(
        self,
        data: BatchedDataDict,
        loss_fn: LossFunction,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Any = None,
    ) -> dict[str, Any]:
        """NeMo RL's train step; with ``policy.draft`` the draft head trains in the same
        step, its loss added (``loss_weight``) and reported as ``draft_loss``."""
        if self.draft is not None and not eval_mode:
            loss_fn = DraftLossWrapper(loss_fn, self.draft_loss_weight)  # type: ignore[assignment]
        return super().train(data, loss_fn, eval_mode, gbs=gbs, mbs=mbs, timer=timer)

    def _draft_inputs(
        self, mb: BatchedDataDict, layout: ForwardLayout, loss_fn: DraftLossWrapper
    ) -> dict[str, torch.Tensor]:
        """The DRAFT loss inputs: the policy's logits as the teacher's and the draft head's
        logits from the policy's detached features and next-token embeddings."""
        assert self.draft is not None
        with torch.no_grad():
            out = self.forward(layout, self.model, output_hidden_states=True)
            logits = layout.unpack(out.logits.float() / self.temperature)
            features = [layout.unpack(out.hidden_states[i + 1]).float() for i in self.draft_layers]
            ids = layout.unpack(layout.input_ids).to(self.device)
            embeddings = self.model.get_input_embeddings()(shift_left(ids)).float()
            lm_head = self.model.get_output_embeddings().weight.float()
        draft_logits = self.draft(features, embeddings, lm_head)
        # NeMo RL's draft loss returns its scalar alone: outside the LossFunction protocol.
        draft_loss: Any = loss_fn.draft_loss_fn
        return prepare_loss_input(logits, mb, draft_loss, draft_logits=draft_logits)[0]

    def _loss_inputs(
        self, mb: BatchedDataDict, layout: ForwardLayout, loss_fn: LossFunction
    ) -> dict[str, torch.Tensor]:
        """The loss's inputs: logprobs of the trained tokens only (``token_mask``) for a
        logprob loss, else per-sample ``[b, S, V]`` logits (unpacked if packed); a reward
        model's ``[b, 1]`` scores, read by its head at each sequence's last token; with the
        draft head, its DRAFT inputs as ``draft_inputs``."""
        inputs = self._policy_loss_inputs(mb, layout, loss_fn)
        if isinstance(loss_fn, DraftLossWrapper):
            return {**inputs, "draft_inputs": self._draft_inputs(mb, layout, loss_fn)}
        return inputs

    def _policy_loss_inputs(
        self, mb: BatchedDataDict, layout: ForwardLayout, loss_fn: LossFunction
    ) -> dict[str, torch.Tensor]:
        if self.scalar_head:
            return {"logits": self.forward(layout).logits.float()}
        if loss_fn.input_type == LossInputType.LOGPROB:
            # the positions a loss reads: its token_mask's, every real token's without one
            wanted = mb["token_mask"][:, 1:] if "token_mask" in mb else layout.valid[:, 1:]
            return {"next_token_logprobs": self._next_token_logprobs(layout, self.model, wanted)}
        return prepare_loss_input(layout.unpack(self._logits(self.model, layout)), mb, loss_fn)[0]

    def calibrate_qkv_fp8_scales(
        self,
        data: BatchedDataDict[GenerationDatumSpec],
        micro_batch_size: int | None = None,
        percentile: float = 99.9,
        margin: float = 1.05,
        include_q: bool = False,
    ) -> dict[str, Any]:
        """Per-layer FP8 scales for K/V (and Q) from this data; see ``fp8_calibration``."""
        self.check_inputs(data)

        def forwards() -> Iterator[tuple[torch.Tensor, Callable[[], Any]]]:
            mbs = micro_batch_size or filled(
                self.cfg.logprob_batch_size, "policy.logprob_batch_size"
            )
            for mb in data.make_microbatch_iterator(mbs):
                layout = self.layout(mb, packed=False)
                assert layout.attention_mask is not None  # padded rows always carry one
                yield layout.attention_mask.bool(), partial(self.forward, layout)

        with torch.no_grad():
            return calibrate_qkv_scales(self.model, forwards(), percentile, margin, include_q)

    # ---- lifecycle --------------------------------------------------------------------

    def _resident_modules(self) -> list[torch.nn.Module]:
        beside = [m for m in (self.reference_model, self.draft) if m is not None]
        return [*super()._resident_modules(), *beside]

    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None:
        self.onload(optimizer=True)
        self.model.train()

    def prepare_for_lp_inference(self) -> None:
        """Weights on the device; with ``policy.offload_optimizer_for_logprob`` the optimizer
        state waits in host memory until training."""
        self.onload(optimizer=False)
        self.model.eval()
        if self.offload_optimizer_for_logprob:
            self.offload(weights=False)

    def finish_training(self, *args: Any, **kwargs: Any) -> None:
        self.model.eval()

    def offload_before_refit(self) -> None:
        """The optimizer state into host memory while the weights are sent."""
        self.offload(weights=False)

    def offload_after_refit(self) -> None:
        """Everything into host memory: the colocated engine generates next."""
        self.offload(weights=True)
        self.model.eval()

    def shutdown(self) -> bool:
        self.optimizer = self.scheduler = self.reference_model = None
        self.head_splits = HeadSplits()
        return True

    # ---- weights out: refit (checkpoints: HFTrainable.save_checkpoint) ---------------

    def _hf_weights(self) -> dict[str, torch.Tensor]:
        """The weights a generation engine loads: with LoRA, adapters merged into the base."""
        model = merged_model(self.model) if isinstance(self.model, PeftModel) else self.model
        return model.state_dict()

    def _save_weights(self, path: str | Path) -> None:
        if isinstance(self.model, PeftModel):
            save_lora_checkpoint(self.model, path)
        else:
            super()._save_weights(path)
        if self.draft is not None:
            save_draft_head(self.draft, path)

    def state_dict_for_refit(self) -> dict[str, torch.Tensor]:
        """HF-named weights in the compute precision, ready for a generation engine's loader."""
        dtype = DTYPES[self.cfg.precision]
        return {name: t.detach().to(dtype) for name, t in self._hf_weights().items()}

    def prepare_refit_info(self) -> dict[str, Any] | None:
        """``{name: (shape, dtype)}`` of what ``state_dict_for_refit`` sends."""
        dtype = DTYPES[self.cfg.precision]
        return {name: (tuple(t.shape), dtype) for name, t in self._hf_weights().items()}


def _load_model(
    path: str | Path, config: PolicyConfig, tokenizer: PreTrainedTokenizerBase
) -> PreTrainedModel:
    """The causal LM, or with ``reward_model_cfg.enabled`` the scalar-head reward model
    (its head zero until trained; it finds each sequence's last token by the pad id)."""
    if config.reward_model_cfg.enabled:
        return load_scalar_head(
            AutoModelForSequenceClassification,
            "ForSequenceClassification",
            path,
            config,
            pad_token_id=tokenizer.pad_token_id,
        )
    return load_pretrained(AutoModelForCausalLM, path, config)


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    frozen = copy.deepcopy(model).eval()
    for param in frozen.parameters():
        param.requires_grad_(False)
    return frozen
