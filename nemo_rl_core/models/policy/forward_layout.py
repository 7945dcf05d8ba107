"""How one microbatch of right-padded samples is laid out for the model's forward pass.

Two layouts give the same per-token results: *padded* (one row per sample, trimmed to the
longest sample) and *packed* (all samples concatenated into one row; position ids restart
at 0 for each sample, which makes transformers' sdpa/eager attention block-diagonal, the
CPU equivalent of flash-attention's varlen kernels). A ``ForwardLayout`` carries the
model inputs and maps per-token outputs back to the samples' ``[batch, seq]`` layout.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ForwardLayout:
    """Model inputs for one microbatch and the way back to ``[batch, seq, ...]``."""

    input_ids: torch.Tensor  # [rows, T]
    position_ids: torch.Tensor  # [rows, T]
    attention_mask: torch.Tensor | None  # [rows, T] for padded rows; None when packed
    source_index: torch.Tensor  # [batch, seq]: flat row-layout position of each token
    valid: torch.Tensor  # [batch, seq]: True where the sample has a token

    def unpack(self, per_token: torch.Tensor) -> torch.Tensor:
        """``[rows, T, ...]`` -> ``[batch, seq, ...]``, zero beyond each sample's length."""
        flat = per_token.reshape(-1, *per_token.shape[2:])
        index = self.source_index.to(per_token.device)
        gathered = flat[index.reshape(-1)].reshape(*index.shape, *per_token.shape[2:])
        mask = self.valid.reshape(*self.valid.shape, *([1] * (per_token.dim() - 2)))
        return gathered * mask.to(device=gathered.device, dtype=gathered.dtype)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def padded_layout(
    input_ids: torch.Tensor, input_lengths: torch.Tensor, multiple: int
) -> ForwardLayout:
    """One row per sample, trimmed to the longest sample (rounded up to ``multiple``)."""
    batch, seq = input_ids.shape
    width = min(_round_up(int(input_lengths.max()), multiple), seq) if batch else 0
    width = max(width, 1)
    positions = torch.arange(seq)
    valid = positions.unsqueeze(0) < input_lengths.unsqueeze(1)
    source = torch.arange(batch).unsqueeze(1) * width + positions.clamp(max=width - 1)
    row_positions = torch.arange(width).expand(batch, width)
    return ForwardLayout(
        input_ids=input_ids[:, :width],
        position_ids=row_positions,
        attention_mask=valid[:, :width].long(),
        source_index=source,
        valid=valid,
    )


def packed_layout(
    input_ids: torch.Tensor, input_lengths: torch.Tensor, multiple: int, total_multiple: int = 1
) -> ForwardLayout:
    """All samples in one row, each padded to ``multiple`` tokens, positions restarting at 0;
    the row is padded to a multiple of ``total_multiple``.

    Padding gets its own restarting positions so it never joins the sample before it.
    """
    batch, seq = input_ids.shape
    lengths = [int(n) for n in input_lengths]
    spans = [_round_up(max(n, 1), multiple) for n in lengths]
    starts = torch.tensor([0, *spans[:-1]], dtype=torch.long).cumsum(0)[:batch]
    used = sum(spans)
    total = max(_round_up(used, total_multiple), 1)
    ids = torch.zeros(total, dtype=input_ids.dtype)
    pos = torch.zeros(total, dtype=torch.long)
    for i, (n, span) in enumerate(zip(lengths, spans, strict=True)):
        start = int(starts[i])
        ids[start : start + n] = input_ids[i, :n]
        pos[start : start + n] = torch.arange(n)
        pos[start + n : start + span] = torch.arange(span - n)
    pos[used:] = torch.arange(total - used)
    positions = torch.arange(seq)
    valid = positions.unsqueeze(0) < input_lengths.unsqueeze(1)
    source = (starts.unsqueeze(1) + positions.unsqueeze(0)).clamp(max=total - 1)
    return ForwardLayout(
        input_ids=ids.unsqueeze(0),
        position_ids=pos.unsqueeze(0),
        attention_mask=None,
        source_index=source,
        valid=valid,
    )
