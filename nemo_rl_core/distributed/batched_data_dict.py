"""NeMo RL's ``BatchedDataDict``: the one batch type every stage passes around.

A dict whose values are batch-first: tensors with the batch on dim 0, or Python lists
with one entry per sample. Every method keeps all keys aligned on the batch axis.

Sharding follows NeMo RL: ``shard_by_batch_size`` cuts the batch into global batches of
``batch_size``, splits each into ``shards`` parts and gives shard ``i`` the ``i``-th part
of every global batch, so each data-parallel rank sees global batch 0 before 1. With
``dynamic_batching_args`` or ``sequence_packing_args`` it also plans token-budget
microbatches per shard and returns ``(shards, sorted_indices)``; ``reorder_data`` with
those indices puts results gathered from the shards back in the original order.
"""

import copy
import math
from collections import UserDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, NotRequired, Self, TypedDict, TypeVar, overload

import torch
import torch.distributed

from nemo_rl_core.data.multimodal_utils import PackedTensor
from nemo_rl_core.data.packing.algorithms import get_packer

DictT = TypeVar("DictT")


class DynamicBatchingArgs(TypedDict):
    """Token-budget microbatches: pass to ``shard_by_batch_size``."""

    max_tokens_per_microbatch: int  # padded tokens (samples x padded length) per microbatch
    sequence_length_round: int  # each microbatch is padded to a multiple of this length
    input_key: str  # the key of the [B, S] input ids
    input_lengths_key: str  # the key of the [B] true lengths


class SequencePackingArgs(TypedDict):
    """Pack sequences into bins of a token budget: pass to ``shard_by_batch_size``."""

    max_tokens_per_microbatch: int  # bin capacity in tokens
    input_key: str
    input_lengths_key: str
    algorithm: str  # a ``PackingAlgorithm`` value, e.g. "modified_first_fit_decreasing"
    sequence_length_pad_multiple: NotRequired[int]  # each sequence padded to this multiple


class BatchedDataDict(UserDict, Generic[DictT]):
    """A dict of batch-first tensors and per-sample lists.

    After ``shard_by_batch_size`` with dynamic batching or packing, a shard also carries
    ``micro_batch_indices`` (per global batch, ``[start, end]`` ranges relative to that
    global batch's first sample), ``micro_batch_lengths`` (per global batch, the padded
    length of each dynamic microbatch or the token count of each packed bin) and
    ``elem_counts_per_gb`` (samples of each global batch in this shard).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.micro_batch_indices: list[list[list[int]]] | None = None
        self.micro_batch_lengths: list[list[int]] | None = None
        self.elem_counts_per_gb: list[int] | None = None

    # Model inputs beside the tokens that some multimodal models take (Gemma 3, Qwen2.5-VL).
    ADDITIONAL_OPTIONAL_KEY_TENSORS = ("token_type_ids", "mm_token_type_ids")

    @classmethod
    def from_batches(
        cls,
        batches: Sequence[Mapping[str, Any]],
        pad_value_dict: dict[str, int | float] | None = None,
    ) -> Self:
        """Concatenate batches key by key; ragged tensors are right-padded on dim 1
        (``pad_value_dict`` gives the pad value per key, default 0), lists and
        ``PackedTensor`` samples are chained. An empty batch may lack keys; a non-empty
        one may not (``KeyError`` naming the key and the batches)."""
        merged = cls()
        if not batches:
            return merged
        pad_value_dict = pad_value_dict or {}
        keys = sorted({key for batch in batches for key in batch})
        for key in keys:
            missing = [i for i, b in enumerate(batches) if key not in b and _mapping_len(b)]
            if missing:
                raise KeyError(f"Key {key!r} is missing from non-empty batches {missing}")
            values = [batch[key] for batch in batches if key in batch]
            if isinstance(values[0], PackedTensor):
                merged[key] = PackedTensor.concat(values)
            elif isinstance(values[0], torch.Tensor):
                merged[key] = _concat_padded(key, values, pad_value_dict.get(key, 0))
            else:
                merged[key] = [item for value in values for item in value]
        return merged

    def get_multimodal_dict(
        self, as_tensors: bool = False, device: str | torch.device | None = None
    ) -> dict[str, Any]:
        """The multimodal model inputs: each ``PackedTensor`` (packed into one tensor with
        ``as_tensors``) and the optional tensors such models take."""
        found: dict[str, Any] = {}
        for key, value in self.data.items():
            if isinstance(value, PackedTensor):
                found[key] = value.as_tensor(device=device) if as_tensors else value
            elif key in self.ADDITIONAL_OPTIONAL_KEY_TENSORS:
                found[key] = value
        return found

    @property
    def size(self) -> int:
        """Batch size; raises naming the keys if they disagree or one is not batch-first."""
        sizes = {key: _batch_len(key, value) for key, value in self.data.items()}
        distinct = set(sizes.values())
        if len(distinct) > 1:
            raise ValueError(f"keys have different batch sizes: {sizes}")
        return distinct.pop() if distinct else 0

    def select_indices(self, indices: Sequence[int] | torch.Tensor) -> Self:
        """A new batch with the samples at ``indices``, in that order."""
        return self._take(indices, type(self)())

    def slice(self, start: int, end: int) -> "SlicedDataDict":
        """Samples ``start`` (inclusive) to ``end`` (exclusive)."""
        sliced = SlicedDataDict()
        for key, value in self.data.items():
            sliced[key] = value[start:end]
        return sliced

    def get_batch(self, batch_idx: int, batch_size: int | None = None) -> "SlicedDataDict":
        """The ``batch_idx``-th global batch of this shard (``batch_size`` samples each, or
        the per-batch counts a dynamic/packed shard carries), with its microbatch plan."""
        if self.elem_counts_per_gb is not None:
            if not 0 <= batch_idx < len(self.elem_counts_per_gb):
                raise IndexError(
                    f"batch {batch_idx} requested; this shard holds "
                    f"{len(self.elem_counts_per_gb)} global batches"
                )
            start = sum(self.elem_counts_per_gb[:batch_idx])
            end = start + self.elem_counts_per_gb[batch_idx]
        else:
            if batch_size is None:
                batch_size = self.size
            start = batch_idx * batch_size
            if start >= self.size:
                raise IndexError(f"batch {batch_idx} of size {batch_size} is past size {self.size}")
            end = min(start + batch_size, self.size)
        batch = self.slice(start, end)
        if self.micro_batch_indices is not None and self.micro_batch_lengths is not None:
            batch.micro_batch_indices = [self.micro_batch_indices[batch_idx]]
            batch.micro_batch_lengths = [self.micro_batch_lengths[batch_idx]]
            batch.elem_counts_per_gb = [end - start]
        return batch

    def repeat_interleave(self, num_repeats: int) -> Self:
        """Repeat each sample ``num_repeats`` times in place (a a b b, not a b a b).

        List items are deep-copied per repeat: the generations of one prompt must not share
        one message log, or appending a response to one appends it to all.
        """
        repeated = type(self)()
        for key, value in self.data.items():
            if isinstance(value, torch.Tensor):
                repeated[key] = value.repeat_interleave(num_repeats, dim=0)
            else:
                repeated[key] = [copy.deepcopy(item) for item in value for _ in range(num_repeats)]
        return repeated

    def chunk(self, rank: int, chunks: int) -> "SlicedDataDict":
        """The ``rank``-th of ``chunks`` contiguous parts ([A A A B B B D D E], rank 2 of 3
        -> [D D E]); sizes differ by at most one, like ``torch.tensor_split``."""
        if not 0 <= rank < chunks:
            raise ValueError(f"rank {rank} is outside 0..{chunks - 1}")
        indices = torch.arange(self.size).tensor_split(chunks)[rank]
        return self._take(indices, SlicedDataDict())

    def reorder_data(self, reorded_indices: Sequence[int] | torch.Tensor) -> None:
        """Undo a reordering in place: sample ``p`` came from position ``reorded_indices[p]``
        (the ``sorted_indices`` that ``shard_by_batch_size`` returned)."""
        order = [int(i) for i in reorded_indices]
        size = self.size
        if sorted(order) != list(range(size)):
            raise ValueError(
                f"reorder_data needs a permutation of 0..{size - 1}, got {len(order)} indices"
            )
        inverse = [0] * size
        for position, original in enumerate(order):
            inverse[original] = position
        self.data = self._take(inverse, type(self)()).data

    def truncate_tensors(self, dim: int, truncated_len: int) -> None:
        """Cut every tensor with a dimension ``dim`` longer than ``truncated_len``, in place."""
        for key, value in self.data.items():
            too_long = isinstance(value, torch.Tensor) and value.dim() > dim
            if too_long and value.shape[dim] > truncated_len:
                self.data[key] = value.narrow(dim, 0, truncated_len)

    def all_gather(self, group: torch.distributed.ProcessGroup | None = None) -> Self:
        """Concatenate this batch across the ranks of ``group``, in rank order."""
        world_size = torch.distributed.get_world_size(group)
        if world_size == 1:
            return self
        gathered: list[Any] = [None] * world_size
        torch.distributed.all_gather_object(gathered, dict(self.data), group=group)
        return type(self).from_batches(gathered)

    # The seed returns a union; these overloads say which member a call gets: the reorder
    # indices come back exactly when a token-budget plan (dynamic batching or packing) is asked.
    @overload
    def shard_by_batch_size(
        self,
        shards: int,
        batch_size: int | None = None,
        allow_uneven_shards: bool = False,
        dynamic_batching_args: None = None,
        sequence_packing_args: None = None,
    ) -> list["SlicedDataDict"]: ...

    @overload
    def shard_by_batch_size(
        self,
        shards: int,
        batch_size: int | None = None,
        allow_uneven_shards: bool = False,
        *,
        dynamic_batching_args: DynamicBatchingArgs,
        sequence_packing_args: None = None,
    ) -> tuple[list["SlicedDataDict"], list[int]]: ...

    @overload
    def shard_by_batch_size(
        self,
        shards: int,
        batch_size: int | None = None,
        allow_uneven_shards: bool = False,
        dynamic_batching_args: None = None,
        *,
        sequence_packing_args: SequencePackingArgs,
    ) -> tuple[list["SlicedDataDict"], list[int]]: ...

    def shard_by_batch_size(
        self,
        shards: int,
        batch_size: int | None = None,
        allow_uneven_shards: bool = False,
        dynamic_batching_args: DynamicBatchingArgs | None = None,
        sequence_packing_args: SequencePackingArgs | None = None,
    ) -> list["SlicedDataDict"] | tuple[list["SlicedDataDict"], list[int]]:
        """Split into ``shards`` data-parallel shards, global batch by global batch.

        [A A B B C C D D] with ``batch_size=4``, ``shards=2`` -> [A A C C], [B B D D]: each
        shard gets its part of global batch 0, then of global batch 1. With
        ``allow_uneven_shards`` (no ``batch_size``) the last shards may be shorter.
        With ``dynamic_batching_args`` each global batch is sorted by length and dealt
        round-robin to the shards, and each shard gets token-budget microbatches; with
        ``sequence_packing_args`` sequences are packed into bins of the budget and the
        bins dealt out. Both return ``(shards, sorted_indices)``.
        """
        assert shards > 0, f"shards must be positive, got {shards}"
        assert dynamic_batching_args is None or sequence_packing_args is None, (
            "dynamic_batching_args and sequence_packing_args cannot be passed together"
        )
        assert not (allow_uneven_shards and batch_size is not None), (
            "batch_size must be None when allow_uneven_shards is True"
        )
        sizes = {key: _batch_len(key, value) for key, value in self.data.items()}
        assert len(set(sizes.values())) <= 1, (
            f"Batch sizes are not the same across the rollout batch: {sizes}"
        )
        total = self.size
        batch_size = total if batch_size is None else batch_size
        assert batch_size > 0 and total % batch_size == 0, (
            f"Total batch size ({total}) is not a multiple of batch_size ({batch_size})"
        )
        assert allow_uneven_shards or batch_size % shards == 0, (
            f"Batch size ({batch_size}) is not a multiple of shards ({shards}); pass "
            "allow_uneven_shards=True to allow shorter last shards"
        )
        chunk_starts = list(range(0, total, batch_size))
        if dynamic_batching_args is not None:
            plan = self._plan_dynamic(shards, batch_size, chunk_starts, dynamic_batching_args)
        elif sequence_packing_args is not None:
            plan = self._plan_packing(shards, batch_size, chunk_starts, sequence_packing_args)
        else:
            return [
                self._take(ids, SlicedDataDict()) for ids in _even_split(shards, batch_size, total)
            ]

        result = []
        for shard_chunks in plan:
            shard = self._take(
                [i for chunk in shard_chunks for i in chunk.indices], SlicedDataDict()
            )
            shard.micro_batch_indices = [chunk.ranges for chunk in shard_chunks]
            shard.micro_batch_lengths = [chunk.lengths for chunk in shard_chunks]
            shard.elem_counts_per_gb = [len(chunk.indices) for chunk in shard_chunks]
            result.append(shard)
        sorted_indices = [
            i for shard_chunks in plan for chunk in shard_chunks for i in chunk.indices
        ]
        return result, sorted_indices

    def make_microbatch_iterator(self, microbatch_size: int) -> Iterator["SlicedDataDict"]:
        """Consecutive microbatches of ``microbatch_size`` samples (the last may be short)."""
        if microbatch_size <= 0:
            raise ValueError(f"microbatch_size must be positive, got {microbatch_size}")
        for start in range(0, self.size, microbatch_size):
            yield self.slice(start, start + microbatch_size)

    def make_microbatch_iterator_with_dynamic_shapes(
        self, sequence_dim: int = 1
    ) -> Iterator["SlicedDataDict"]:
        """The dynamic microbatches of this global batch, each cut to its padded length."""
        ranges, lengths = self._single_plan("make_microbatch_iterator_with_dynamic_shapes")
        for (start, end), length in zip(ranges, lengths, strict=True):
            microbatch = self.slice(start, end)
            microbatch.truncate_tensors(dim=sequence_dim, truncated_len=length)
            yield microbatch

    def get_microbatch_iterator_dynamic_shapes_len(self) -> int:
        return len(self._single_plan("get_microbatch_iterator_dynamic_shapes_len")[0])

    def make_microbatch_iterator_for_packable_sequences(self) -> Iterator["SlicedDataDict"]:
        """The packed bins of this global batch, one microbatch per bin (still padded)."""
        ranges, _ = self._single_plan("make_microbatch_iterator_for_packable_sequences")
        for start, end in ranges:
            yield self.slice(start, end)

    def get_microbatch_iterator_for_packable_sequences_len(self) -> tuple[int, int]:
        """(number of bins, largest bin's token count) of this global batch."""
        ranges, lengths = self._single_plan("get_microbatch_iterator_for_packable_sequences_len")
        return len(ranges), max(lengths, default=0)

    def to(self, device: str | torch.device) -> Self:
        """Move every tensor (and packed tensor) to ``device``, in place; lists stay."""
        for key, value in self.data.items():
            if isinstance(value, torch.Tensor | PackedTensor):
                self.data[key] = value.to(device)
        return self

    def get_dict(self) -> dict[str, Any]:
        return dict(self.data)

    # ---- internals -------------------------------------------------------------------

    def _take(self, indices: Sequence[int] | torch.Tensor, into: "BatchedDataDict") -> Any:
        if isinstance(indices, torch.Tensor):
            indices = indices.tolist()
        index = torch.as_tensor(indices, dtype=torch.long)
        for key, value in self.data.items():
            if isinstance(value, torch.Tensor):
                into[key] = value[index]
            elif isinstance(value, PackedTensor):
                into[key] = value.slice(indices)
            else:
                into[key] = [value[i] for i in indices]
        return into

    def _single_plan(self, method: str) -> tuple[list[list[int]], list[int]]:
        if self.micro_batch_indices is None or self.micro_batch_lengths is None:
            raise ValueError(
                f"{method} needs a microbatch plan: shard with dynamic_batching_args or "
                f"sequence_packing_args first"
            )
        if len(self.micro_batch_indices) != 1:
            raise ValueError(
                f"{method} works on one global batch; this shard holds "
                f"{len(self.micro_batch_indices)}: take one with get_batch(i) first"
            )
        return self.micro_batch_indices[0], self.micro_batch_lengths[0]

    def _lengths(
        self, args_name: str, args: dict[str, Any], required: tuple[str, ...]
    ) -> list[int]:
        for field in required:
            if field not in args:
                raise ValueError(f"{args_name}[{field!r}] is missing")
        key = args["input_lengths_key"]
        if key not in self.data:
            raise ValueError(f"{args_name}['input_lengths_key'] names {key!r}, not in the batch")
        if args["input_key"] not in self.data:
            raise ValueError(
                f"{args_name}['input_key'] names {args['input_key']!r}, not in the batch"
            )
        if args["max_tokens_per_microbatch"] <= 0:
            raise ValueError(f"{args_name}['max_tokens_per_microbatch'] must be positive")
        value = self.data[key]
        return [int(v) for v in (value.tolist() if isinstance(value, torch.Tensor) else value)]

    def _plan_dynamic(
        self, shards: int, batch_size: int, chunk_starts: list[int], args: DynamicBatchingArgs
    ) -> list[list["_ChunkPlan"]]:
        required = ("max_tokens_per_microbatch", "sequence_length_round", "input_key")
        lengths = self._lengths(
            "dynamic_batching_args", dict(args), (*required, "input_lengths_key")
        )
        budget = args["max_tokens_per_microbatch"]
        # NeMo RL's rule: a length rounded up to sequence_length_round, but never past the
        # batch's own width (the padding a microbatch can have at most).
        inputs = self.data[args["input_key"]]
        width = inputs.shape[1] if isinstance(inputs, torch.Tensor) and inputs.dim() > 1 else None

        def padded_length(length: int) -> int:
            rounded = _round_up(length, args["sequence_length_round"])
            return rounded if width is None else min(rounded, width)

        plan: list[list[_ChunkPlan]] = [[] for _ in range(shards)]
        for start in chunk_starts:
            chunk = range(start, min(start + batch_size, len(lengths)))
            by_length = sorted(chunk, key=lambda i: lengths[i])
            per_shard = [by_length[s::shards] for s in range(shards)]
            groups = [_budget_groups(ids, lengths, budget, padded_length) for ids in per_shard]
            most = max(len(g) for g in groups)
            for s, (ids, shard_groups) in enumerate(zip(per_shard, groups, strict=True)):
                _split_to(shard_groups, most)
                padded = [padded_length(max(lengths[ids[i]] for i in g)) for g in shard_groups]
                plan[s].append(_ChunkPlan(ids, _ranges([len(g) for g in shard_groups]), padded))
        return plan

    def _plan_packing(
        self, shards: int, batch_size: int, chunk_starts: list[int], args: SequencePackingArgs
    ) -> list[list["_ChunkPlan"]]:
        required = ("max_tokens_per_microbatch", "algorithm", "input_key")
        lengths = self._lengths(
            "sequence_packing_args", dict(args), (*required, "input_lengths_key")
        )
        multiple = args.get("sequence_length_pad_multiple", 1)
        plan: list[list[_ChunkPlan]] = [[] for _ in range(shards)]
        for start in chunk_starts:
            chunk = list(range(start, min(start + batch_size, len(lengths))))
            padded = [_round_up(lengths[i], multiple) for i in chunk]
            packer = get_packer(
                args["algorithm"], args["max_tokens_per_microbatch"], bin_count_multiple=shards
            )
            bins = packer.pack(padded)
            loads = [sum(padded[i] for i in b) for b in bins]
            by_load = sorted(range(len(bins)), key=lambda b: -loads[b])
            for s in range(shards):
                mine = by_load[s::shards]
                ids = [chunk[i] for b in mine for i in bins[b]]
                sizes = [len(bins[b]) for b in mine]
                plan[s].append(_ChunkPlan(ids, _ranges(sizes), [loads[b] for b in mine]))
        return plan


class SlicedDataDict(BatchedDataDict):
    """A part of a ``BatchedDataDict`` (a shard, a microbatch)."""


class _ChunkPlan:
    """One global batch of one shard: its samples and microbatch ranges/lengths."""

    def __init__(self, indices: list[int], ranges: list[list[int]], lengths: list[int]) -> None:
        self.indices = indices
        self.ranges = ranges
        self.lengths = lengths


def _even_split(shards: int, batch_size: int, total: int) -> list[list[int]]:
    """NeMo RL's shard order: shard s takes part s of every global batch."""
    shard_size = math.ceil(batch_size / shards)
    result: list[list[int]] = [[] for _ in range(shards)]
    for chunk_start in range(0, total, batch_size):
        chunk_end = min(chunk_start + batch_size, total)
        for s in range(shards):
            start = min(chunk_start + s * shard_size, chunk_end)
            end = min(chunk_start + (s + 1) * shard_size, chunk_end)
            result[s].extend(range(start, end))
    return result


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple if multiple > 1 else value


def _budget_groups(
    ids: list[int], lengths: list[int], budget: int, padded_length: Callable[[int], int]
) -> list[list[int]]:
    """Greedy groups of consecutive positions (ids sorted by length) within ``budget``
    padded tokens: count x (the longest length as ``padded_length`` pads it)."""
    groups: list[list[int]] = []
    for position, index in enumerate(ids):
        padded = padded_length(lengths[index])
        if padded > budget:
            raise ValueError(
                f"sample {index} has length {lengths[index]} (padded {padded}), over "
                f"dynamic_batching_args['max_tokens_per_microbatch']={budget}"
            )
        if groups and (len(groups[-1]) + 1) * padded <= budget:
            groups[-1].append(position)
        else:
            groups.append([position])
    return groups


def _split_to(groups: list[list[int]], count: int) -> None:
    """Split the largest groups until there are ``count`` (ranks run equal microbatches)."""
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda g: len(groups[g]))
        if len(groups[largest]) < 2:
            return
        group = groups[largest]
        half = len(group) // 2
        groups[largest : largest + 1] = [group[:half], group[half:]]


def _ranges(sizes: list[int]) -> list[list[int]]:
    """Consecutive [start, end) ranges of the given sizes."""
    ranges = []
    start = 0
    for size in sizes:
        ranges.append([start, start + size])
        start += size
    return ranges


def _mapping_len(batch: Mapping[str, Any]) -> int:
    """Samples in a batch (0 for an empty mapping), read off its first value."""
    return next((_batch_len(key, value) for key, value in batch.items()), 0)


def _batch_len(key: str, value: Any) -> int:
    if isinstance(value, PackedTensor):
        return len(value)
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise ValueError(f"key {key!r} holds a 0-d tensor; values must be batch-first")
        return value.shape[0]
    if isinstance(value, list | tuple):
        return len(value)
    raise TypeError(f"key {key!r} holds {type(value).__name__}; expected a tensor or a list")


def _concat_padded(key: str, tensors: list[torch.Tensor], pad_value: int | float) -> torch.Tensor:
    dims = {t.dim() for t in tensors}
    if len(dims) != 1:
        raise ValueError(f"key {key!r}: tensors of different ranks {sorted(dims)} cannot be merged")
    if tensors[0].dim() <= 1 or all(t.shape[1:] == tensors[0].shape[1:] for t in tensors):
        return torch.cat(tensors, dim=0)
    if any(t.shape[2:] != tensors[0].shape[2:] for t in tensors):
        raise ValueError(f"key {key!r}: tensors differ beyond dim 1 and cannot be padded")
    width = max(t.shape[1] for t in tensors)
    padded = [
        torch.nn.functional.pad(
            t, (0, 0) * (t.dim() - 2) + (0, width - t.shape[1]), value=pad_value
        )
        for t in tensors
    ]
    return torch.cat(padded, dim=0)
