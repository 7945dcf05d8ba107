"""Rewards from a local sequence-classification model (NeMo RL's ``RewardModelEnvironment``).

Each conversation is rendered with the reward model's own chat template and scored in
batches of ``batch_size``; the reward is the model's single logit (a Bradley-Terry reward
model). Conversations longer than ``max_model_len`` keep their last tokens, where the
response is. Keys NeMo RL uses for multi-GPU placement (``resources``, ``dtensor_cfg``,
...) are accepted and have no effect on one machine.
"""

from typing import Any

import torch

from nemo_rl_core.data.chat_templates import render_chat
from nemo_rl_core.data.interfaces import LLMMessageLogType
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.config import RewardModelEnvConfig
from nemo_rl_core.environments.interfaces import EnvironmentInterface, EnvironmentReturn
from nemo_rl_core.environments.metrics import batch_rewards


class RewardModelEnvironment(EnvironmentInterface[dict[str, Any]]):
    """Single-turn: reward = the reward model's score of the whole conversation."""

    config_class = RewardModelEnvConfig

    def __init__(self, cfg: RewardModelEnvConfig | dict[str, Any]):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from nemo_rl_core.models.local_models import resolve_model

        self.cfg = RewardModelEnvConfig.model_validate(cfg)
        model_path = resolve_model(self.cfg.model_name)
        self.tokenizer = AutoTokenizer.from_pretrained(self.cfg.tokenizer.name or model_path)
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            model_path, dtype=getattr(torch, self.cfg.precision)
        ).eval()
        if self.model.config.num_labels != 1:
            raise ValueError(
                f"env.reward_model.model_name {self.cfg.model_name}: a Bradley-Terry reward model "
                f"has 1 output label, this one has {self.model.config.num_labels}"
            )
        self.model.config.pad_token_id = self.tokenizer.pad_token_id

    def score(self, conversations: list[LLMMessageLogType]) -> torch.Tensor:
        """One float32 score per conversation, computed ``batch_size`` at a time."""
        texts = [
            render_chat(
                self.tokenizer,
                [{"role": _chat_role(m["role"]), "content": m["content"]} for m in log],
            )
            for log in conversations
        ]
        scores = []
        for start in range(0, len(texts), self.cfg.batch_size):
            encoded = self.tokenizer(
                texts[start : start + self.cfg.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=self.cfg.max_model_len is not None,
                max_length=self.cfg.max_model_len,
                add_special_tokens=False,
            )
            with torch.no_grad():
                logits = self.model(**encoded).logits
            scores.append(logits[:, 0].float())
        return torch.cat(scores) if scores else torch.zeros(0)

    def step(
        self,
        message_log_batch: list[LLMMessageLogType],
        metadata: list[dict[str, Any]],
        *args: Any,
        **kwargs: Any,
    ) -> EnvironmentReturn[dict[str, Any]]:
        rewards = self.score(message_log_batch)
        return EnvironmentReturn(
            observations=[
                {"role": "environment", "content": f"Environment: reward {r:.4f}"}
                for r in rewards.tolist()
            ],
            metadata=[dict(m or {}) for m in metadata],
            next_stop_strings=[None] * len(rewards),
            rewards=rewards,
            terminateds=torch.ones(len(rewards), dtype=torch.bool),
            answers=None,
        )

    def global_post_process_and_metrics(
        self, batch: BatchedDataDict
    ) -> tuple[BatchedDataDict, dict[str, Any]]:
        rewards = batch_rewards(batch)
        return batch, {
            "mean_reward": rewards.mean().item() if len(rewards) else 0.0,
            "std_reward": rewards.std().item() if len(rewards) > 1 else 0.0,
            "num_samples": len(rewards),
        }


def _chat_role(role: str) -> str:
    """Environment turns read as user turns to a chat-templated reward model."""
    return role if role in ("system", "user", "assistant") else "user"
