"""Losses over packed batches: one row holding many sequences back to back.

The model sees [1, T] packed input; the loss must score every sequence exactly as in
the unpacked [B, S] batch. The wrapper cuts the packed logits at ``cu_seqlens`` and
calls the wrapped loss per sequence (per pair for preference losses) on the matching
rows of the unpacked data; with global normalization the pieces sum to the batch loss.
"""

from collections.abc import Mapping
from typing import Any

import torch

from nemo_rl_core.algorithms.loss.interfaces import LossFunction, aggregate_microbatch_metrics
from nemo_rl_core.algorithms.loss.preference import PreferenceLossFn
from nemo_rl_core.algorithms.loss.utils import prepare_loss_input
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


class SequencePackingLossWrapper:
    """Apply ``loss_fn`` to packed logits, sequence by sequence.

    ``cu_seqlens_q`` [B+1] are the cumulative unpadded lengths; ``cu_seqlens_q_padded``
    (default: the same) are the start offsets in the packed row when each sequence was
    padded (e.g. to a multiple of the tensor-parallel size).
    """

    def __init__(
        self,
        loss_fn: LossFunction,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_q_padded: torch.Tensor | None = None,
    ):
        self.loss_fn = loss_fn
        self.loss_type = loss_fn.loss_type
        self.input_type = loss_fn.input_type
        self.cu_seqlens_q = cu_seqlens_q.tolist()
        padded = cu_seqlens_q if cu_seqlens_q_padded is None else cu_seqlens_q_padded
        self.cu_seqlens_q_padded = padded.tolist()

    def __call__(
        self,
        logits: torch.Tensor,
        data: BatchedDataDict,
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
        **prepare_kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """``logits`` [1, T, ...] packed; ``data`` the unpacked microbatch [B, S]."""
        num_seqs = len(self.cu_seqlens_q) - 1
        if num_seqs != data.size:
            raise ValueError(f"cu_seqlens_q describes {num_seqs} sequences, data holds {data.size}")
        # a preference loss scores chosen/rejected pairs: keep each pair together
        group = 2 if isinstance(self.loss_fn, PreferenceLossFn) else 1
        total_loss: torch.Tensor | None = None
        shares: list[dict[str, Any]] = []
        for start in range(0, num_seqs, group):
            indices = list(range(start, min(start + group, num_seqs)))
            lengths = [self.cu_seqlens_q[i + 1] - self.cu_seqlens_q[i] for i in indices]
            width = max(lengths)
            group_logits = torch.cat(
                [
                    self._unpack(logits, i, length, width)
                    for i, length in zip(indices, lengths, strict=True)
                ]
            )
            group_data = _truncate(data.select_indices(indices), width, data_width=_width(data))
            extra = {
                key: self._slice_extra(value, indices, width)
                for key, value in prepare_kwargs.items()
            }
            loss_input, group_data = prepare_loss_input(
                group_logits, group_data, self.loss_fn, **extra
            )
            result = self.loss_fn(
                data=group_data,
                global_valid_seqs=global_valid_seqs,
                global_valid_toks=global_valid_toks,
                **loss_input,
            )
            # the draft loss returns its scalar alone, as NeMo RL's does
            loss, group_metrics = result if isinstance(result, tuple) else (result, {})
            total_loss = loss if total_loss is None else total_loss + loss
            shares.append(group_metrics)
        if total_loss is None:
            raise ValueError("cannot compute a loss over an empty packed batch")
        return total_loss, aggregate_microbatch_metrics(shares)

    def _unpack(self, packed: torch.Tensor, index: int, length: int, width: int) -> torch.Tensor:
        """Sequence ``index`` of a [1, T, ...] packed tensor as [1, width, ...] (zero-padded)."""
        start = self.cu_seqlens_q_padded[index]
        piece = packed[:, start : start + length]
        if width == length:
            return piece
        pad = piece.new_zeros((1, width - length, *piece.shape[2:]))
        return torch.cat([piece, pad], dim=1)

    def _slice_extra(self, value: Any, indices: list[int], width: int) -> Any:
        """Packed extra inputs (e.g. ``draft_logits``) are unpacked like the logits."""
        if not isinstance(value, torch.Tensor):
            return value
        lengths = [self.cu_seqlens_q[i + 1] - self.cu_seqlens_q[i] for i in indices]
        return torch.cat(
            [self._unpack(value, i, n, width) for i, n in zip(indices, lengths, strict=True)]
        )


def _width(data: Mapping[str, Any]) -> int | None:
    if "input_ids" in data:
        return data["input_ids"].shape[1]
    if "token_mask" in data:
        return data["token_mask"].shape[1]
    return None


def _truncate(data: BatchedDataDict, width: int, data_width: int | None) -> BatchedDataDict:
    """Cut the sequence axis of every [B, S, ...] tensor to ``width``."""
    truncated = type(data)()
    for key, value in data.items():
        is_sequence = (
            isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == data_width
        )
        truncated[key] = value[:, :width] if is_sequence else value
    return truncated
