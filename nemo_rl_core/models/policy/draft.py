"""NeMo RL's ``policy.draft``: an Eagle-style draft head trained beside the policy.

Speculative decoding lets a small draft propose tokens that the policy then verifies; the
draft is worth as much as the policy accepts. EAGLE drafts from the policy's own features:
at position t the head reads the hidden states of the policy's layers
``aux_layer_indices`` at t (EAGLE-3; the last layer alone by default, EAGLE-1) and the
embedding of token t+1, and predicts token t+2 through the policy's (frozen) LM head. It
learns the policy's full next-token distribution at t+1 (``DraftCrossEntropyLossFn``, the
seed's ``LossInputType.DRAFT``), added to the policy's loss times ``loss_weight`` as NeMo
RL's ``DraftLossWrapper`` adds it. Policy features are detached: the draft never changes
the policy. Its weights sit in ``draft/`` of the policy's checkpoint.
"""

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from nemo_rl_core.algorithms.loss.draft import DraftCrossEntropyLossFn
from nemo_rl_core.algorithms.loss.interfaces import LossFunction
from nemo_rl_core.models.policy.config import DraftConfig

DRAFT_DIR = "draft"
DRAFT_FILE = "model.safetensors"
# The head's random start is the same in every process, so a run resumed or rerun from
# step 0 trains the same draft bit for bit.
DRAFT_INIT_SEED = 0


class DraftHead(torch.nn.Module):
    """``fuse`` the chosen layers' features, ``mix`` in the next token's embedding, one
    residual MLP block, then RMSNorm and the policy's LM head."""

    def __init__(self, hidden_size: int, num_features: int, eps: float) -> None:
        super().__init__()
        self.fuse = torch.nn.Linear(num_features * hidden_size, hidden_size, bias=False)
        self.mix = torch.nn.Linear(2 * hidden_size, hidden_size, bias=False)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(hidden_size, 2 * hidden_size),
            torch.nn.SiLU(),
            torch.nn.Linear(2 * hidden_size, hidden_size),
        )
        self.norm = torch.nn.RMSNorm(hidden_size, eps=eps)

    def forward(
        self, features: list[torch.Tensor], next_embeddings: torch.Tensor, lm_head: torch.Tensor
    ) -> torch.Tensor:
        """``[B, S, V]`` draft logits of token t+2 at each position t."""
        fused = self.fuse(torch.cat(features, dim=-1))
        hidden = self.mix(torch.cat([fused, next_embeddings], dim=-1))
        hidden = hidden + self.mlp(hidden)
        return torch.nn.functional.linear(self.norm(hidden), lm_head)


def feature_layers(config: DraftConfig, num_layers: int) -> list[int]:
    """The policy layers whose outputs the head reads; a clear error for one out of range."""
    layers = config.aux_layer_indices if config.aux_layer_indices else [num_layers - 1]
    bad = [index for index in layers if not 0 <= index < num_layers]
    if bad:
        raise ValueError(
            f"policy.draft.aux_layer_indices: {bad} out of range for a model of {num_layers} "
            "layers (0-based)"
        )
    return list(layers)


def build_draft_head(
    config: DraftConfig, model_config: Any, weights_path: str | Path | None
) -> DraftHead:
    """A seeded random head for ``model_config`` (a transformers config), or the one stored
    in ``weights_path/draft`` when the policy resumes from a checkpoint that holds one."""
    layers = feature_layers(config, model_config.num_hidden_layers)
    eps = getattr(model_config, "rms_norm_eps", 1e-6)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(DRAFT_INIT_SEED)
        head = DraftHead(model_config.hidden_size, len(layers), eps)
    stored = Path(weights_path) / DRAFT_DIR / DRAFT_FILE if weights_path is not None else None
    if stored is not None and stored.is_file():
        head.load_state_dict(load_file(stored))
    return head


def save_draft_head(head: DraftHead, weights_path: str | Path) -> None:
    folder = Path(weights_path) / DRAFT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()},
        folder / DRAFT_FILE,
    )


class DraftLossWrapper:
    """The policy's loss plus ``loss_weight`` x the draft's soft cross-entropy to the policy
    (NeMo RL's ``DraftLossWrapper``); ``draft_inputs`` are the DRAFT inputs of
    ``prepare_loss_input``. Declares the wrapped loss's types, so the policy prepares the
    wrapped loss's own inputs as before."""

    def __init__(self, loss_fn: LossFunction, loss_weight: float) -> None:
        self.loss_fn = loss_fn
        self.loss_weight = loss_weight
        self.draft_loss_fn = DraftCrossEntropyLossFn()
        self.loss_type = loss_fn.loss_type
        self.input_type = loss_fn.input_type

    def __call__(
        self,
        data: Any,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        draft_inputs: dict[str, torch.Tensor],
        **loss_inputs: Any,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        loss, metrics = self.loss_fn(
            data=data,
            global_valid_seqs=global_valid_seqs,
            global_valid_toks=global_valid_toks,
            **loss_inputs,
        )
        draft_loss = self.draft_loss_fn(
            data=data,
            global_valid_seqs=global_valid_seqs,
            global_valid_toks=global_valid_toks,
            **draft_inputs,
        )
        metrics = {**metrics, "draft_loss": float(draft_loss.detach())}
        return loss + self.loss_weight * draft_loss, metrics
