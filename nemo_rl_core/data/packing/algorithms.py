"""Bin-packing algorithms for sequence packing (``nemo_rl.data.packing.algorithms``).

A packer turns sequence lengths into bins (lists of sequence indices) whose total length
never exceeds ``bin_capacity``, the token budget of one packed microbatch. Fewer bins
mean fewer forward passes; ``bin_count_multiple`` makes the bin count divisible by the
number of data-parallel shards so every rank runs the same number of microbatches.
"""

import enum
import random
from abc import ABC, abstractmethod


class PackingAlgorithm(enum.Enum):
    """The packers NeMo RL offers, by their config name (``sequence_packing.algorithm``)."""

    CONCATENATIVE = "concatenative"
    FIRST_FIT_DECREASING = "first_fit_decreasing"
    FIRST_FIT_SHUFFLE = "first_fit_shuffle"
    MODIFIED_FIRST_FIT_DECREASING = "modified_first_fit_decreasing"


class SequencePacker(ABC):
    """Packs sequence lengths into bins of at most ``bin_capacity`` tokens."""

    def __init__(
        self,
        bin_capacity: int,
        collect_metrics: bool = False,
        min_bin_count: int | None = None,
        bin_count_multiple: int | None = None,
    ) -> None:
        if bin_capacity <= 0:
            raise ValueError(f"bin_capacity must be positive, got {bin_capacity}")
        if min_bin_count is not None and min_bin_count < 0:
            raise ValueError(f"min_bin_count must be nonnegative, got {min_bin_count}")
        if bin_count_multiple is not None and bin_count_multiple <= 0:
            raise ValueError(f"bin_count_multiple must be positive, got {bin_count_multiple}")
        self.bin_capacity = bin_capacity
        self.collect_metrics = collect_metrics
        self.min_bin_count = min_bin_count
        self.bin_count_multiple = bin_count_multiple
        self.metrics: dict[str, float] = {}

    def pack(self, sequence_lengths: list[int]) -> list[list[int]]:
        """Bins of sequence indices; each bin's total length is at most ``bin_capacity``."""
        lengths = [int(length) for length in sequence_lengths]
        for index, length in enumerate(lengths):
            if length < 0 or length > self.bin_capacity:
                raise ValueError(
                    f"sequence {index} has length {length}, outside [0, bin_capacity="
                    f"{self.bin_capacity}]; raise max_tokens_per_microbatch or truncate it"
                )
        bins = self._pack_implementation(lengths)
        bins = self._adjust_bin_count(bins, lengths)
        if self.collect_metrics:
            used = sum(lengths)
            self.metrics = {
                "num_bins": len(bins),
                "utilization": used / (len(bins) * self.bin_capacity) if bins else 0.0,
            }
        return bins

    @abstractmethod
    def _pack_implementation(self, sequence_lengths: list[int]) -> list[list[int]]:
        """Bins of indices for non-empty input, each within capacity."""

    def _adjust_bin_count(self, bins: list[list[int]], lengths: list[int]) -> list[list[int]]:
        """Split the fullest multi-sequence bins until the count meets min and multiple."""
        target = max(len(bins), self.min_bin_count or 0)
        multiple = self.bin_count_multiple or 1
        target = -(-target // multiple) * multiple
        if target > len(lengths):
            raise ValueError(
                f"Cannot create {target} bins with only {len(lengths)} sequences: every bin "
                "needs one; lower min_bin_count / bin_count_multiple or pack more sequences"
            )
        while len(bins) < target:
            splittable = [b for b in bins if len(b) > 1]
            fullest = max(splittable, key=lambda b: sum(lengths[i] for i in b))
            half = len(fullest) // 2
            bins.append(fullest[half:])
            del fullest[half:]
        return bins


def _first_fit(
    order: list[int],
    lengths: list[int],
    capacity: int,
    bins: list[list[int]] | None = None,
) -> list[list[int]]:
    """Put each index of ``order`` into the first bin (of ``bins``, then new ones) it fits."""
    bins = bins if bins is not None else []
    loads = [sum(lengths[i] for i in b) for b in bins]
    for index in order:
        for slot, load in enumerate(loads):
            if load + lengths[index] <= capacity:
                bins[slot].append(index)
                loads[slot] += lengths[index]
                break
        else:
            bins.append([index])
            loads.append(lengths[index])
    return bins


def _decreasing(lengths: list[int]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


class ConcatenativePacker(SequencePacker):
    """Keeps the input order; starts a new bin when the next sequence does not fit."""

    def _pack_implementation(self, sequence_lengths: list[int]) -> list[list[int]]:
        bins: list[list[int]] = []
        load = self.bin_capacity + 1
        for index, length in enumerate(sequence_lengths):
            if load + length > self.bin_capacity:
                bins.append([])
                load = 0
            bins[-1].append(index)
            load += length
        return bins


class FirstFitDecreasingPacker(SequencePacker):
    """Longest first, each into the first bin it fits (at most 11/9 OPT + 6/9 bins)."""

    def _pack_implementation(self, sequence_lengths: list[int]) -> list[list[int]]:
        return _first_fit(_decreasing(sequence_lengths), sequence_lengths, self.bin_capacity)


class FirstFitShufflePacker(SequencePacker):
    """First fit in a seeded random order: bins mix long and short sequences."""

    def __init__(self, *args: object, seed: int = 0, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.seed = seed

    def _pack_implementation(self, sequence_lengths: list[int]) -> list[list[int]]:
        order = list(range(len(sequence_lengths)))
        random.Random(self.seed).shuffle(order)
        return _first_fit(order, sequence_lengths, self.bin_capacity)


class ModifiedFirstFitDecreasingPacker(SequencePacker):
    """Never more bins than FFD: the fewest bins of FFD, best-fit decreasing, and the
    pairing step of Johnson and Garey's MFFD (each large > C/2 sequence in its own bin,
    paired with the largest medium (C/3, C/2] that fits, the rest first-fit decreasing),
    which avoids the bins FFD wastes on medium-only bins."""

    def _pack_implementation(self, sequence_lengths: list[int]) -> list[list[int]]:
        capacity = self.bin_capacity
        order = _decreasing(sequence_lengths)
        candidates = [
            _first_fit(order, sequence_lengths, capacity),
            _best_fit(order, sequence_lengths, capacity),
            _large_medium_pairing(order, sequence_lengths, capacity),
        ]
        return min(candidates, key=len)


def _best_fit(order: list[int], lengths: list[int], capacity: int) -> list[list[int]]:
    """Each index into the fullest bin it still fits."""
    bins: list[list[int]] = []
    loads: list[int] = []
    for index in order:
        fits = [slot for slot, load in enumerate(loads) if load + lengths[index] <= capacity]
        if fits:
            slot = max(fits, key=lambda s: loads[s])
            bins[slot].append(index)
            loads[slot] += lengths[index]
        else:
            bins.append([index])
            loads.append(lengths[index])
    return bins


def _large_medium_pairing(order: list[int], lengths: list[int], capacity: int) -> list[list[int]]:
    large = [i for i in order if 2 * lengths[i] > capacity]
    medium = [i for i in order if capacity < 3 * lengths[i] <= 2 * capacity]
    bins = [[i] for i in large]
    for slot in reversed(range(len(bins))):  # smallest large item first
        load = lengths[bins[slot][0]]
        partner = next((i for i in medium if load + lengths[i] <= capacity), None)
        if partner is not None:  # the largest medium that fits
            bins[slot].append(partner)
            medium.remove(partner)
    placed = {i for b in bins for i in b}
    return _first_fit([i for i in order if i not in placed], lengths, capacity, bins)


_PACKERS: dict[PackingAlgorithm, type[SequencePacker]] = {
    PackingAlgorithm.CONCATENATIVE: ConcatenativePacker,
    PackingAlgorithm.FIRST_FIT_DECREASING: FirstFitDecreasingPacker,
    PackingAlgorithm.FIRST_FIT_SHUFFLE: FirstFitShufflePacker,
    PackingAlgorithm.MODIFIED_FIRST_FIT_DECREASING: ModifiedFirstFitDecreasingPacker,
}


def get_packer(
    algorithm: PackingAlgorithm | str,
    bin_capacity: int,
    collect_metrics: bool = False,
    min_bin_count: int | None = None,
    bin_count_multiple: int | None = None,
) -> SequencePacker:
    """The packer for ``algorithm``: an enum member or its name in any case
    (``"first_fit_decreasing"``, ``"FIRST_FIT_DECREASING"``)."""
    if isinstance(algorithm, str):
        algorithm = PackingAlgorithm.__members__.get(algorithm.upper(), algorithm)
    if not isinstance(algorithm, PackingAlgorithm):
        names = [a.value for a in PackingAlgorithm]
        raise ValueError(f"unknown packing algorithm {algorithm!r}; use one of {names}")
    return _PACKERS[algorithm](
        bin_capacity,
        collect_metrics=collect_metrics,
        min_bin_count=min_bin_count,
        bin_count_multiple=bin_count_multiple,
    )
