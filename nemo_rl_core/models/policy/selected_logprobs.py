"""Next-token logprobs computed only at the positions a caller reads.

A causal LM's head projects every position's hidden state onto the vocabulary, and the
padded forward's ``[rows, width, vocab]`` logits are then unpacked to the samples'
``[batch, seq, vocab]`` before a log-softmax. A training loss reads only the trained
(completion) tokens, and an inference caller only the samples' own tokens, so on a GRPO
microbatch most of that work is prompt and padding: projecting just the needed hidden
states (per token, as TRL's ``logits_to_keep`` does per row) halves a SmolLM2
forward + backward on CPU (bench/RESULTS.md, "TRL side by side").

The shortcut needs the model split into body and head (``get_decoder()``,
``get_output_embeddings()``); it is taken only when ``head(body(x))`` reproduces the
model's own logits on a probe input, so models that post-process logits (soft-capping,
logit scales) keep the full path.
"""

from collections.abc import Callable
from typing import Any

import torch

from nemo_rl_core.models.policy.forward_layout import ForwardLayout

PROBE_IDS = torch.tensor([[1, 2, 3, 4, 5]])


def split_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """``(body, head)`` of ``model`` when ``head(body(x).last_hidden_state)`` gives its logits
    exactly; ``None`` when it has no such split or post-processes its logits."""
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    body, head = get_decoder(), get_head()
    if body is None or head is None or body is model:
        return None
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            ids = PROBE_IDS.to(device)
            expected = model(input_ids=ids, use_cache=False).logits
            hidden = body(input_ids=ids, use_cache=False).last_hidden_state
            split_ok = torch.equal(head(hidden), expected)
    except (AttributeError, TypeError, ValueError):  # a body that is not a plain decoder
        split_ok = False
    finally:
        model.train(was_training)
    return (body, head) if split_ok else None


def selected_token_logprobs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    layout: ForwardLayout,
    wanted: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """``[batch, seq-1]``: at ``(b, t)`` where ``wanted`` and token ``t+1`` exists,
    ``log p(token t+1 | <= t)`` from logits / ``temperature``; 0 elsewhere.

    ``hidden`` is the body's ``[rows, width, hidden]`` output for ``layout``; only the
    selected rows reach the head, so no ``[.., vocab]`` tensor larger than
    ``[selected, vocab]`` exists in the forward or the backward.
    """
    needed = wanted.bool().cpu() & layout.valid[:, 1:]
    sample, position = needed.nonzero(as_tuple=True)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    source = layout.source_index.to(hidden.device)
    sample, position = sample.to(hidden.device), position.to(hidden.device)
    logits = head(flat_hidden[source[sample, position]]).float() / temperature
    flat_ids = layout.input_ids.reshape(-1).to(hidden.device)
    targets = flat_ids[source[sample, position + 1]].long()
    logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)
    out = logprobs.new_zeros(needed.shape)
    return out.index_put((sample, position), logprobs)


class HeadSplits:
    """``split_head`` per model, probed once: a policy asks on every microbatch."""

    def __init__(self) -> None:
        self._splits: dict[int, tuple[Any, tuple[torch.nn.Module, torch.nn.Module] | None]] = {}

    def __call__(self, model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
        entry = self._splits.get(id(model))
        if entry is None or entry[0] is not model:
            entry = (model, split_head(model))
            self._splits[id(model)] = entry
        return entry[1]
