"""On-policy distillation (NeMo RL's ``nemo_rl.algorithms.distillation``): the work of its
stages that GRPO's rollout stages do not already do.

NeMo RL's ``distillation_train`` loop: the student generates (and the environments score
the responses, for metrics only), the teacher's top-k logits on the generated tokens are
computed, and the student takes one step of ``DistillationLossFn``, the KL between the two
on the teacher's top-k tokens of each assistant position. Here the teacher's top-k is a
stored stage, so a rerun of ``train`` trains on the same tensors bit for bit.
"""

import json
from pathlib import Path
from typing import Any

import torch

from nemo_rl_core.algorithms.distillation_config import (  # noqa: F401 - NeMo RL's names
    DistillationConfig,
    DistillationMasterConfig,
)
from nemo_rl_core.algorithms.loss import DistillationLossFn
from nemo_rl_core.data.llm_message_utils import message_logs_to_train_data
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.local_models import resolve_model
from nemo_rl_core.models.policy.hf_loading import load_tokenizer
from nemo_rl_core.models.policy.interfaces import PolicyInterface
from nemo_rl_core.utils.config import ConfigError

MasterConfig = DistillationMasterConfig  # NeMo RL's name for it in this module


def check_teacher_fits(config: DistillationMasterConfig) -> None:
    """NeMo RL's ``check_vocab_equality`` and the top-k within the vocabulary, refused before
    any of the run is written: the loss compares the two models' logits token id by token
    id, so the teacher must share the student's tokenizer (token -> id mapping, size) and
    the last dimension of its logits (``vocab_size``)."""
    student, teacher = config.policy, config.teacher
    student_vocab = load_tokenizer(student).get_vocab()
    teacher_vocab = load_tokenizer(teacher).get_vocab()
    if student_vocab != teacher_vocab:
        differing = len(set(student_vocab.items()) ^ set(teacher_vocab.items()))
        raise ConfigError(
            f"teacher.model_name: {teacher.model_name!r} has a vocabulary of "
            f"{len(teacher_vocab)} tokens that differs from policy.model_name "
            f"{student.model_name!r}'s ({len(student_vocab)} tokens, {differing} token->id "
            "entries not shared); distillation compares logits token by token, so the "
            "teacher must use the student's tokenizer"
        )
    student_size, teacher_size = _vocab_size(student.model_name), _vocab_size(teacher.model_name)
    if student_size != teacher_size:
        raise ConfigError(
            f"teacher.model_name: {teacher.model_name!r} has logits over {teacher_size} ids "
            f"(config.json vocab_size), policy.model_name {student.model_name!r} over "
            f"{student_size}; the two must match"
        )
    k = config.distillation.topk_logits_k
    if k > teacher_size:
        raise ConfigError(
            f"distillation.topk_logits_k={k}: larger than the teacher's vocabulary "
            f"({teacher_size} tokens); at most {teacher_size}"
        )


def _vocab_size(model_name: str) -> int:
    config = json.loads((Path(resolve_model(model_name)) / "config.json").read_text())
    return int(config.get("vocab_size") or config.get("text_config", {})["vocab_size"])


def rollouts_to_train_data(
    batch: BatchedDataDict, tokenizer: Any, config: DistillationMasterConfig
) -> BatchedDataDict:
    """What the teacher and the student read, as NeMo RL builds it: the rollouts flattened
    into ``input_ids``/``input_lengths``, the assistant tokens as ``token_mask`` and each
    sample's ``loss_multiplier`` as ``sample_mask``."""
    flat = message_logs_to_train_data(
        batch["message_log"],
        pad_token_id=tokenizer.pad_token_id,
        make_sequence_length_divisible_by=config.policy.make_sequence_length_divisible_by,
    )
    return BatchedDataDict(
        {
            "input_ids": flat["input_ids"],
            "input_lengths": flat["input_lengths"],
            "token_mask": flat["token_mask"],
            "sample_mask": torch.as_tensor(batch["loss_multiplier"], dtype=torch.float32),
        }
    )


def teacher_is_sharded(config: DistillationMasterConfig) -> bool:
    """The HF teacher is sharded over the training world as NeMo RL's DTensor teacher is
    (FSDP2 x its own ``dtensor_cfg.tensor_parallel_size``), so its stage runs on the
    training ranks; a Megatron teacher spreads over its own ``tensor x data parallel``
    ranks from the stage's process (``models.megatron.launcher``)."""
    return config.teacher.training_backend == "hf"


def teacher_topk_logits(
    teacher: PolicyInterface, train_data: BatchedDataDict, config: DistillationMasterConfig
) -> BatchedDataDict:
    """``train_data`` with the teacher's top-``topk_logits_k`` logits and token ids of the next
    token at every position, ``[B, S, k]`` as ``DistillationLossFn`` reads them: the policy
    gives S-1 positions (nothing follows the last token), so the last one is zero-padded
    (the loss never reads it)."""
    topk = teacher.get_topk_logits(
        train_data,
        k=config.distillation.topk_logits_k,
        micro_batch_size=config.teacher.logprob_batch_size,
    )
    with_teacher: BatchedDataDict[Any] = BatchedDataDict(dict(train_data))
    for name in ("topk_logits", "topk_indices"):
        with_teacher[f"teacher_{name}"] = torch.nn.functional.pad(topk[name], (0, 0, 0, 1))
    return with_teacher


def build_loss_fn(config: DistillationMasterConfig) -> DistillationLossFn:
    return DistillationLossFn(config.loss_fn)
