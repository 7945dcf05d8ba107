"""Bin packing for sequence packing: bins never over capacity, every sequence placed once,
and bin counts that meet the minimum and the shard multiple."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_rl_core.data.packing.algorithms import PackingAlgorithm, get_packer

ALGORITHMS = [a.value for a in PackingAlgorithm]


def _check_bins(bins: list[list[int]], lengths: list[int], capacity: int) -> None:
    placed = sorted(i for b in bins for i in b)
    assert placed == list(range(len(lengths)))
    for b in bins:
        assert b, "empty bin"
        assert sum(lengths[i] for i in b) <= capacity, (b, [lengths[i] for i in b])


@settings(max_examples=60, deadline=None)
@given(
    algorithm=st.sampled_from(ALGORITHMS),
    capacity=st.integers(1, 64),
    data=st.data(),
    multiple=st.none() | st.integers(1, 4),
)
def test_bins_never_exceed_capacity(
    algorithm: str, capacity: int, data: st.DataObject, multiple: int | None
) -> None:
    lengths = data.draw(st.lists(st.integers(0, capacity), min_size=4, max_size=40))
    packer = get_packer(algorithm, capacity, bin_count_multiple=multiple)
    try:
        bins = packer.pack(lengths)
    except ValueError as exc:  # only when the multiple needs more bins than sequences
        assert "Cannot create" in str(exc) and multiple and len(lengths) % multiple
        return
    _check_bins(bins, lengths, capacity)
    if multiple:
        assert len(bins) % multiple == 0


def test_first_fit_decreasing_finds_the_tight_packing() -> None:
    lengths = [6, 5, 4, 5, 3, 7]  # pairs to 10: (6,4) (5,5) (7,3)
    bins = get_packer("first_fit_decreasing", 10).pack(lengths)
    assert sorted(sorted(lengths[i] for i in b) for b in bins) == [[3, 7], [4, 6], [5, 5]]
    concatenative = get_packer("concatenative", 10).pack(lengths)
    assert len(concatenative) > len(bins)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 100), min_size=1, max_size=30))
def test_modified_ffd_never_needs_more_bins_than_ffd(lengths: list[int]) -> None:
    mffd = get_packer(PackingAlgorithm.MODIFIED_FIRST_FIT_DECREASING, 100).pack(lengths)
    _check_bins(mffd, lengths, 100)
    assert len(mffd) <= len(get_packer("first_fit_decreasing", 100).pack(lengths))


def test_modified_ffd_beats_ffd_where_ffd_wastes_a_bin() -> None:
    lengths = [14, 49, 98, 17, 31, 13, 72]  # FFD: (98) (72,17) (49,31,14) (13)
    assert len(get_packer("first_fit_decreasing", 100).pack(lengths)) == 4
    assert len(get_packer("modified_first_fit_decreasing", 100).pack(lengths)) == 3


def test_min_bin_count_splits_bins() -> None:
    packer = get_packer("first_fit_decreasing", 100, min_bin_count=4, collect_metrics=True)
    bins = packer.pack([10, 10, 10, 10, 10])
    assert len(bins) == 4
    assert packer.metrics["num_bins"] == 4
    with pytest.raises(ValueError, match="Cannot create 4 bins with only 2 sequences"):
        get_packer("first_fit_decreasing", 100, min_bin_count=4).pack([1, 2])
    with pytest.raises(ValueError, match="Cannot create 3 bins with only 2"):
        get_packer("concatenative", 100, bin_count_multiple=3).pack([1, 2])


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="sequence 1 has length 11"):
        get_packer("first_fit_decreasing", 10).pack([3, 11])
    with pytest.raises(ValueError, match="'best_fit'.*first_fit_decreasing"):
        get_packer("best_fit", 10)


@pytest.mark.parametrize("name", ["MODIFIED_FIRST_FIT_DECREASING", "Modified_First_Fit_Decreasing"])
def test_algorithm_names_are_case_insensitive(name: str) -> None:
    packer = get_packer(name, 100)
    assert type(packer) is type(get_packer(PackingAlgorithm.MODIFIED_FIRST_FIT_DECREASING, 100))


def test_bad_bin_count_constraints_are_named() -> None:
    with pytest.raises(ValueError, match="min_bin_count must be nonnegative, got -1"):
        get_packer("concatenative", 100, min_bin_count=-1)
    with pytest.raises(ValueError, match="bin_count_multiple must be positive, got 0"):
        get_packer("concatenative", 100, bin_count_multiple=0)
    with pytest.raises(ValueError, match="bin_capacity must be positive, got 0"):
        get_packer("concatenative", 0)
    with pytest.raises(ValueError, match="unknown packing algorithm <object"):
        get_packer(object(), 100)  # type: ignore[arg-type]
