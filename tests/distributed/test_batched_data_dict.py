"""BatchedDataDict on hand-built batches: NeMo RL's shard order, uneven shards, dynamic
batching token budgets, packed bins within budget, and errors that name the key."""

import os
import random
import socket

import pytest
import torch
import torch.multiprocessing as mp

from nemo_rl_core.distributed.batched_data_dict import (
    BatchedDataDict,
    DynamicBatchingArgs,
    SequencePackingArgs,
    SlicedDataDict,
)


def _padded_batch(lengths: list[int], pad: int = 0) -> BatchedDataDict:
    """input_ids whose row i is (i+1) repeated lengths[i] times, then ``pad``."""
    width = max(lengths)
    ids = torch.full((len(lengths), width), pad)
    for row, length in enumerate(lengths):
        ids[row, :length] = row + 1
    return BatchedDataDict(
        input_ids=ids,
        input_lengths=torch.tensor(lengths),
        sample_id=list(range(len(lengths))),
    )


def test_from_batches_pads_ragged_tensors_and_concatenates_lists() -> None:
    a = {"ids": torch.ones(2, 3, dtype=torch.long), "text": ["a", "b"], "r": torch.tensor([1, 2])}
    b = {"ids": torch.full((1, 5), 2), "text": ["c"], "r": torch.tensor([3])}
    merged = BatchedDataDict.from_batches([a, b], pad_value_dict={"ids": -1})
    assert merged["ids"].tolist() == [[1, 1, 1, -1, -1], [1, 1, 1, -1, -1], [2, 2, 2, 2, 2]]
    assert merged["text"] == ["a", "b", "c"]
    assert merged["r"].tolist() == [1, 2, 3]
    with pytest.raises(KeyError, match="'r' is missing from non-empty batches \\[1\\]"):
        BatchedDataDict.from_batches([a, {"ids": torch.ones(1, 3)}])


def test_size_errors_name_the_keys() -> None:
    with pytest.raises(ValueError, match="'a': 2.*'b': 3"):
        _ = BatchedDataDict(a=torch.zeros(2, 4), b=[1, 2, 3]).size
    with pytest.raises(ValueError, match="'loss'.*0-d"):
        _ = BatchedDataDict(loss=torch.tensor(1.0)).size
    with pytest.raises(TypeError, match="'cfg'"):
        _ = BatchedDataDict(cfg={"a": 1}).size
    with pytest.raises(AssertionError, match="Batch sizes are not the same"):
        BatchedDataDict(a=torch.zeros(2), b=torch.zeros(3)).shard_by_batch_size(1)


def test_select_slice_get_batch_repeat_and_microbatches() -> None:
    batch = BatchedDataDict(x=torch.arange(6), s=list("abcdef"))
    picked = batch.select_indices([4, 0])
    assert picked["x"].tolist() == [4, 0] and picked["s"] == ["e", "a"]
    assert isinstance(picked, BatchedDataDict)
    sliced = batch.slice(1, 3)
    assert isinstance(sliced, SlicedDataDict) and sliced["s"] == ["b", "c"]
    assert batch.get_batch(1, 4)["s"] == ["e", "f"]
    with pytest.raises(IndexError):
        batch.get_batch(2, 4)
    assert batch.repeat_interleave(2)["s"][:4] == ["a", "a", "b", "b"]
    assert [mb["s"] for mb in batch.make_microbatch_iterator(4)] == [list("abcd"), list("ef")]
    assert batch.to("cpu") is batch


def test_chunk_splits_like_tensor_split() -> None:
    batch = BatchedDataDict(x=list("AAABBBDDE"), t=torch.arange(9))
    assert batch.chunk(2, 3)["x"] == list("DDE")
    assert [batch.chunk(r, 4).size for r in range(4)] == [3, 2, 2, 2]
    with pytest.raises(ValueError, match="rank 3"):
        batch.chunk(3, 3)


def test_truncate_tensors_cuts_only_longer_tensors() -> None:
    batch = BatchedDataDict(ids=torch.zeros(2, 8), flag=torch.zeros(2), short=torch.zeros(2, 3))
    batch.truncate_tensors(dim=1, truncated_len=5)
    assert batch["ids"].shape == (2, 5) and batch["flag"].shape == (2,)
    assert batch["short"].shape == (2, 3)


def test_reorder_data_inverts_a_permutation_and_rejects_others() -> None:
    batch = BatchedDataDict(x=torch.tensor([30, 10, 20]), s=["c", "a", "b"])
    batch.reorder_data([2, 0, 1])  # sample 0 came from position 2, ...
    assert batch["x"].tolist() == [10, 20, 30] and batch["s"] == ["a", "b", "c"]
    with pytest.raises(ValueError, match="permutation"):
        batch.reorder_data([0, 0, 1])


def test_shard_order_matches_nemo_rl() -> None:
    batch = BatchedDataDict(problem_id=[0, 0, 1, 1, 2, 2, 3, 3], data=list(range(1, 9)))
    shards = batch.shard_by_batch_size(shards=2)
    assert [s["problem_id"] for s in shards] == [[0, 0, 1, 1], [2, 2, 3, 3]]
    shards = batch.shard_by_batch_size(shards=2, batch_size=4)
    assert [s["problem_id"] for s in shards] == [[0, 0, 2, 2], [1, 1, 3, 3]]
    assert all(isinstance(s, SlicedDataDict) for s in shards)


def test_uneven_shards() -> None:
    batch = BatchedDataDict(problem_id=[0, 1, 2, 3, 4], t=torch.arange(5))
    shards = batch.shard_by_batch_size(shards=2, allow_uneven_shards=True)
    assert [s["problem_id"] for s in shards] == [[0, 1, 2], [3, 4]]
    shards = batch.shard_by_batch_size(shards=4, allow_uneven_shards=True)
    assert [s["t"].tolist() for s in shards] == [[0, 1], [2, 3], [4], []]
    with pytest.raises(AssertionError, match=r"not a multiple of shards \(2\)"):
        batch.shard_by_batch_size(shards=2)
    with pytest.raises(AssertionError, match="batch_size must be None"):
        batch.shard_by_batch_size(shards=2, batch_size=5, allow_uneven_shards=True)
    with pytest.raises(AssertionError, match=r"multiple of batch_size \(2\)"):
        batch.shard_by_batch_size(shards=1, batch_size=2)


def _dynamic(budget: int, round_to: int = 1) -> DynamicBatchingArgs:
    return {
        "max_tokens_per_microbatch": budget,
        "sequence_length_round": round_to,
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
    }


def _packing(budget: int, algorithm: str, multiple: int = 1) -> SequencePackingArgs:
    return {
        "max_tokens_per_microbatch": budget,
        "input_key": "input_ids",
        "input_lengths_key": "input_lengths",
        "algorithm": algorithm,
        "sequence_length_pad_multiple": multiple,
    }


def _gather_and_restore(
    batch: BatchedDataDict, shards: list[SlicedDataDict], order: list[int]
) -> None:
    """The shards hold every sample once; gathering and reorder_data restores the batch."""
    assert sorted(order) == list(range(batch.size))
    gathered = BatchedDataDict.from_batches([s.get_dict() for s in shards])
    gathered.reorder_data(order)
    assert gathered["sample_id"] == batch["sample_id"]
    assert torch.equal(gathered["input_ids"], batch["input_ids"])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("shards,batch_size", [(1, None), (2, None), (2, 8), (4, 16)])
def test_dynamic_batching_respects_the_token_budget(
    seed: int, shards: int, batch_size: int | None
) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 30) for _ in range(16)]
    batch = _padded_batch(lengths)
    budget, round_to = rng.choice([(32, 1), (64, 4), (100, 8)])
    shards_out, order = batch.shard_by_batch_size(
        shards, batch_size=batch_size, dynamic_batching_args=_dynamic(budget, round_to)
    )
    _gather_and_restore(batch, shards_out, order)
    n_batches = 16 // (batch_size or 16)
    for shard in shards_out:
        assert len(shard.micro_batch_indices) == n_batches
    for gb in range(n_batches):
        counts = {
            shard.get_batch(gb).get_microbatch_iterator_dynamic_shapes_len() for shard in shards_out
        }
        assert len(counts) == 1, "every shard must run the same number of microbatches"
        for shard in shards_out:
            part = shard.get_batch(gb, batch_size)
            seen = 0
            for mb in part.make_microbatch_iterator_with_dynamic_shapes():
                true_max = int(mb["input_lengths"].max())
                width = mb["input_ids"].shape[1]
                assert width >= true_max
                assert mb.size * width <= budget
                seen += mb.size
                # the cut keeps every real token
                for row, length in enumerate(mb["input_lengths"].tolist()):
                    assert (mb["input_ids"][row, :length] != 0).all()
            assert seen == part.size
            # rounded up to round_to, but never past the batch's own width (NeMo RL's cap)
            width = batch["input_ids"].shape[1]
            assert all(
                length % round_to == 0 or length == width for length in part.micro_batch_lengths[0]
            )


def test_dynamic_batching_sorts_and_deals_by_length() -> None:
    batch = _padded_batch([5, 1, 8, 3, 2, 7, 4, 6])
    shards, order = batch.shard_by_batch_size(2, dynamic_batching_args=_dynamic(12, 2))
    assert shards[0]["input_lengths"].tolist() == [1, 3, 5, 7]
    assert shards[1]["input_lengths"].tolist() == [2, 4, 6, 8]
    assert order == [1, 3, 0, 5, 4, 6, 7, 2]
    assert shards[0].micro_batch_indices == [[[0, 2], [2, 3], [3, 4]]]
    assert shards[0].micro_batch_lengths == [[4, 6, 8]]


def test_a_rounded_length_is_capped_at_the_batch_width_as_nemo_rl_caps_it() -> None:
    """150 tokens round up to 192 (sequence_length_round 64), over a 160-token budget; the
    batch is only 160 wide, so NeMo RL pads to 160 and runs, one sample per microbatch."""
    batch = _padded_batch([150, 20, 160])
    shards, _ = batch.shard_by_batch_size(1, dynamic_batching_args=_dynamic(160, 64))
    assert shards[0]["input_lengths"].tolist() == [20, 150, 160]
    assert shards[0].micro_batch_lengths == [[64, 160, 160]]
    assert shards[0].micro_batch_indices == [[[0, 1], [1, 2], [2, 3]]]


def test_dynamic_batching_errors_name_the_setting() -> None:
    batch = _padded_batch([5, 40])
    with pytest.raises(ValueError, match="sample 1 has length 40.*max_tokens_per_microbatch"):
        batch.shard_by_batch_size(1, dynamic_batching_args=_dynamic(32))
    args = _dynamic(64)
    del args["sequence_length_round"]
    with pytest.raises(ValueError, match="sequence_length_round"):
        batch.shard_by_batch_size(1, dynamic_batching_args=args)
    with pytest.raises(ValueError, match="'lens'"):
        batch.shard_by_batch_size(
            1, dynamic_batching_args={**_dynamic(64), "input_lengths_key": "lens"}
        )
    with pytest.raises(AssertionError, match="cannot be passed together"):
        batch.shard_by_batch_size(
            1,
            dynamic_batching_args=_dynamic(64),
            sequence_packing_args=_packing(64, "concatenative"),
        )
    with pytest.raises(ValueError, match="shard with dynamic_batching_args"):
        next(batch.make_microbatch_iterator_with_dynamic_shapes())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "algorithm", ["first_fit_decreasing", "modified_first_fit_decreasing", "concatenative"]
)
@pytest.mark.parametrize("shards,batch_size", [(1, None), (2, None), (2, 12)])
def test_packed_bins_never_exceed_the_budget(
    seed: int, algorithm: str, shards: int, batch_size: int | None
) -> None:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 40) for _ in range(24)]
    batch = _padded_batch(lengths)
    budget, multiple = rng.choice([(40, 1), (64, 8), (128, 4)])
    shards_out, order = batch.shard_by_batch_size(
        shards, batch_size=batch_size, sequence_packing_args=_packing(budget, algorithm, multiple)
    )
    _gather_and_restore(batch, shards_out, order)
    n_batches = 24 // (batch_size or 24)
    for gb in range(n_batches):
        parts = [shard.get_batch(gb) for shard in shards_out]
        assert len({p.get_microbatch_iterator_for_packable_sequences_len()[0] for p in parts}) == 1
        for part in parts:
            n_bins, largest = part.get_microbatch_iterator_for_packable_sequences_len()
            bins = list(part.make_microbatch_iterator_for_packable_sequences())
            assert len(bins) == n_bins and sum(b.size for b in bins) == part.size
            for packed, tokens in zip(bins, part.micro_batch_lengths[0], strict=True):
                padded = [-(-n // multiple) * multiple for n in packed["input_lengths"].tolist()]
                assert sum(padded) == tokens <= budget
                assert tokens <= largest


def test_packing_rejects_a_sequence_over_the_budget() -> None:
    with pytest.raises(ValueError, match="sequence 1 has length 48"):
        _padded_batch([3, 45]).shard_by_batch_size(
            1, sequence_packing_args=_packing(40, "first_fit_decreasing", 8)
        )


def _gather_worker(rank: int, port: int, results: "mp.Queue") -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        local = BatchedDataDict(
            ids=torch.full((rank + 1, rank + 2), rank), name=[f"r{rank}"] * (rank + 1)
        )
        gathered = local.all_gather()
        results.put((rank, gathered["ids"].tolist(), gathered["name"]))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.e2e  # two fresh interpreters importing torch: ~10 s of CPU, not for the fast loop
@pytest.mark.distributed
def test_all_gather_concatenates_in_rank_order_over_gloo() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Fresh processes: a forked one would inherit the test process's state, a default process
    # group (the Megatron tests make one in-process) or Prefect's exit hooks (a flow run).
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_gather_worker, args=(r, port, results)) for r in range(2)]
    for proc in procs:
        proc.start()
    outputs = dict((r, (ids, names)) for r, ids, names in (results.get(timeout=120) for _ in procs))
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    expected_ids = [[0, 0, 0], [1, 1, 1], [1, 1, 1]]  # rank 0's row padded with 0
    for rank in range(2):
        assert outputs[rank] == (expected_ids, ["r0", "r1", "r1"])


def test_repeat_interleave_copies_list_items_so_repeats_do_not_alias():
    batch = BatchedDataDict({"message_log": [[{"role": "user"}]], "x": torch.tensor([1])})
    repeated = batch.repeat_interleave(2)
    repeated["message_log"][0].append({"role": "assistant"})
    assert [len(log) for log in repeated["message_log"]] == [2, 1]
    assert len(batch["message_log"][0]) == 1
