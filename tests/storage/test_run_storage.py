"""Run storage against local disk and a real S3 server (moto): layout, manifest, checksums,
atomic commit, checkpoints and the lease. Every test runs on both backends."""

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.lease import LeaseHeldError, LeaseLostError, LocalObject, S3Object
from nemo_rl_core.storage.manifest import Manifest
from nemo_rl_core.storage.outage import BUDGET_ENV
from nemo_rl_core.storage.run_storage import (
    ConfigConflictError,
    IntegrityError,
    ObjectRef,
    RunStorage,
    StorageError,
    validate_name,
)


@pytest.fixture
def storage(storage_root: tuple[str, dict | None]) -> RunStorage:
    root, options = storage_root
    return RunStorage(root, "run-1", storage_options=options)


def _batch(size: int = 4) -> BatchedDataDict:
    lengths = torch.arange(1, size + 1)
    ids = torch.zeros(size, size, dtype=torch.int64)
    for row, length in enumerate(lengths.tolist()):
        ids[row, :length] = torch.arange(1, length + 1)
    return BatchedDataDict(
        input_ids=ids,
        input_lengths=lengths,
        logprobs=torch.randn(size, size),
        text=[f"sample {i}" for i in range(size)],
    )


def _assert_same(a: BatchedDataDict, b: BatchedDataDict) -> None:
    assert list(a.keys()) == list(b.keys())
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("name", ["run-1", "grpo_2024.11", "A"])
def test_validate_name_accepts_plain_segments(name: str) -> None:
    assert validate_name("run id", name) == name


@pytest.mark.parametrize("name", ["", "..", ".", "a/b", "/abs", "a..b", "x y", "a\\b", "ü"])
def test_validate_name_rejects_paths_and_names_the_kind(name: str) -> None:
    with pytest.raises(ValueError, match="stage") as info:
        validate_name("stage", name)
    assert repr(name) in str(info.value)


def test_run_id_is_validated() -> None:
    with pytest.raises(ValueError, match="run id"):
        RunStorage("/tmp/x", "../escape")


def test_object_ref_round_trips_and_rejects_incomplete_dicts() -> None:
    ref = ObjectRef("iter_000001/generate/batch.arrow", 10, "ab" * 32)
    assert ObjectRef.from_dict(ref.to_dict()) == ref
    with pytest.raises(ValueError, match="sha256"):
        ObjectRef.from_dict({"key": "k", "size": 1})


def test_run_config_is_written_once(storage: RunStorage) -> None:
    assert storage.read_run_config() is None
    config = {"grpo": {"num_prompts_per_step": 8}, "policy": {"model_name": "tiny-llama"}}
    storage.write_run_config(config)
    assert storage.read_run_config() == config
    storage.write_run_config(config)  # the same config again is fine (a rerun)
    changed = {"grpo": {"num_prompts_per_step": 16}, "policy": {"model_name": "tiny-llama"}}
    with pytest.raises(ConfigConflictError, match=r"grpo\.num_prompts_per_step"):
        storage.write_run_config(changed)
    storage.write_run_config(changed, allow_change=True)
    assert storage.read_run_config() == changed


@pytest.mark.parametrize(("batch_format", "magic"), [("arrow", b"ARROW1"), ("parquet", b"PAR1")])
def test_batch_round_trip_uses_the_layout(
    storage_root: tuple[str, dict | None], batch_format: str, magic: bytes
) -> None:
    root, options = storage_root
    storage = RunStorage(root, "run-1", storage_options=options, batch_format=batch_format)
    batch = _batch()
    ref = storage.write_batch(3, "generate", batch)
    assert ref.key == f"iter_000003/generate/batch.{batch_format}"
    path = f"{storage.objects.run_path}/{ref.key}"
    assert storage.fs.size(path) == ref.size
    assert storage.fs.cat_file(path, start=0, end=len(magic)) == magic
    _assert_same(storage.read_batch(ref), batch)
    named = storage.write_batch(3, "generate", batch, name="extra")
    assert named.key == f"iter_000003/generate/extra.{batch_format}"
    assert storage.run_url.endswith("/runs/run-1")


def test_arrow_is_the_default_and_parquet_outputs_of_older_runs_still_read(
    storage_root: tuple[str, dict | None],
) -> None:
    """A run written with Parquet (as before the Arrow default) resumes by manifest keys."""
    root, options = storage_root
    old = RunStorage(root, "run-1", storage_options=options, batch_format="parquet")
    batch = _batch()
    old_ref = old.write_batch(0, "generate", batch)
    old.record_stage(0, "generate", {"p": "1"}, {"batch": old_ref})
    storage = RunStorage(root, "run-1", storage_options=options)
    entry = storage.completed_stage(0, "generate", {"p": "1"})
    assert entry is not None
    ref = entry.outputs["batch"]
    assert ref.key == "iter_000000/generate/batch.parquet"
    _assert_same(storage.read_batch(ref), batch)
    assert storage.write_batch(1, "generate", _batch()).key.endswith("/batch.arrow")


def test_unknown_batch_format_names_the_value() -> None:
    with pytest.raises(ValueError, match="'feather'"):
        RunStorage("/tmp/x", "run-1", batch_format="feather")  # type: ignore[arg-type]


def test_tensors_of_a_read_batch_are_writable_without_touching_the_stored_object(
    storage: RunStorage,
) -> None:
    """Local reads map the file copy-on-write and Arrow IPC tensors view that map."""
    batch = _batch()
    ref = storage.write_batch(2, "logprob", batch)
    first = storage.read_batch(ref)
    first["logprobs"] += 1.0
    first["input_lengths"].zero_()
    _assert_same(storage.read_batch(ref), batch)


def test_json_round_trip(storage: RunStorage) -> None:
    ref = storage.write_json(0, "train", "metrics", {"loss": 1.5, "grad_norm": [0.1, 0.2]})
    assert ref.key == "iter_000000/train/metrics.json"
    assert storage.read_json(ref) == {"loss": 1.5, "grad_norm": [0.1, 0.2]}


def test_bad_names_are_refused_before_writing(storage: RunStorage) -> None:
    with pytest.raises(ValueError, match="stage"):
        storage.write_batch(0, "../generate", _batch())
    with pytest.raises(ValueError, match="name"):
        storage.write_json(0, "train", "a/b", {})
    with pytest.raises(ValueError, match="iteration"):
        storage.write_batch(-1, "generate", _batch())
    with pytest.raises(ValueError, match="relative"):
        storage.read_batch(ObjectRef("../other-run/x.parquet", 1, "0" * 64))


def test_tampered_object_raises_integrity_error(storage: RunStorage) -> None:
    ref = storage.write_batch(1, "reward", _batch())
    path = f"{storage.objects.run_path}/{ref.key}"
    data = bytearray(storage.fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    storage.fs.pipe_file(path, bytes(data))
    storage.forget_writes()  # as a new flow run does; until then this process has the bytes
    with pytest.raises(IntegrityError, match="sha256") as info:
        storage.read_batch(ref)
    assert ref.key in str(info.value)
    for short in (bytes(data[:-10]), b""):  # an empty local file cannot be memory-mapped
        storage.fs.pipe_file(path, short)
        with pytest.raises(IntegrityError, match="bytes"):
            storage.read_batch(ref)
    storage.fs.rm_file(path)
    with pytest.raises(IntegrityError, match="missing"):
        storage.read_batch(ref)


def test_manifest_records_and_finds_completed_stages(storage: RunStorage) -> None:
    assert storage.read_manifest(2) == Manifest({})
    assert storage.completed_stage(2, "generate", {"prompts": "abc"}) is None
    ref = storage.write_batch(2, "generate", _batch())
    entry = storage.record_stage(2, "generate", {"prompts": "abc"}, {"batch": ref}, {"tok_s": 3.0})
    assert entry.complete and entry.outputs == {"batch": ref}
    found = storage.completed_stage(2, "generate", {"prompts": "abc"})
    assert found == entry and found.metrics == {"tok_s": 3.0}
    assert storage.completed_stage(2, "generate", {"prompts": "other"}) is None
    assert storage.completed_stage(2, "reward", {"prompts": "abc"}) is None

    reward = storage.write_json(2, "reward", "metrics", {"mean": 0.5})
    storage.record_stage(2, "reward", {"generate": ref.sha256}, {"metrics": reward})
    assert set(storage.read_manifest(2).stages) == {"generate", "reward"}
    assert storage.iterations() == [2]

    storage.mark_stale(2, ["reward"])
    assert storage.read_manifest(2).stale_stages() == ["reward"]
    assert storage.completed_stage(2, "reward", {"generate": ref.sha256}) is None
    assert storage.completed_stage(2, "generate", {"prompts": "abc"}) is not None


def test_parts_of_a_split_stage_have_entries_of_their_own(storage: RunStorage) -> None:
    """A shard is recorded beside its stage's outputs, never in the manifest; it counts as
    done only with the same inputs and intact outputs; marking the stage stale marks it."""
    assert storage.completed_part(1, "reward", "shard-0-of-2", {"generate": "x"}) is None
    ref = storage.write_batch(1, "reward", _batch(), name="shard-0-of-2.batch")
    storage.record_part(1, "reward", "shard-0-of-2", {"generate": "x"}, {"batch": ref})
    assert storage.read_manifest(1) == Manifest({})
    assert storage.completed_part(1, "reward", "shard-0-of-2", {"generate": "x"}) is not None
    assert storage.completed_part(1, "reward", "shard-0-of-2", {"generate": "y"}) is None
    assert storage.completed_part(1, "reward", "shard-1-of-2", {"generate": "x"}) is None
    storage.mark_stale(1, ["reward"])
    assert storage.completed_part(1, "reward", "shard-0-of-2", {"generate": "x"}) is None
    storage.record_part(1, "reward", "shard-0-of-2", {"generate": "x"}, {"batch": ref})
    storage.fs.pipe_file(f"{storage.objects.run_path}/{ref.key}", b"short")
    assert storage.completed_part(1, "reward", "shard-0-of-2", {"generate": "x"}) is None


def test_completed_stage_is_none_when_an_output_is_gone_or_resized(storage: RunStorage) -> None:
    ref = storage.write_batch(0, "generate", _batch())
    storage.record_stage(0, "generate", {}, {"batch": ref})
    assert storage.completed_stage(0, "generate", {}) is not None
    storage.fs.pipe_file(f"{storage.objects.run_path}/{ref.key}", b"short")
    assert storage.completed_stage(0, "generate", {}) is None
    storage.fs.rm_file(f"{storage.objects.run_path}/{ref.key}")
    assert storage.completed_stage(0, "generate", {}) is None


def _fail_commit(storage: RunStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the commit step of the next writes fail as a dropped connection would."""
    if storage.on_local_disk:

        def broken_replace(self: Path, target: object) -> None:
            raise ConnectionResetError("disk went away before the rename")

        monkeypatch.setattr(Path, "replace", broken_replace)
    else:
        from botocore.exceptions import EndpointConnectionError

        real_call = type(storage.fs)._call_s3

        async def broken_call(self, method, *args, **kwargs):  # type: ignore[no-untyped-def]
            if method in ("put_object", "complete_multipart_upload"):
                raise EndpointConnectionError(endpoint_url="http://127.0.0.1")
            return await real_call(self, method, *args, **kwargs)

        monkeypatch.setattr(type(storage.fs), "_call_s3", broken_call)


def test_interrupted_write_leaves_no_output_and_the_manifest_intact(
    storage: RunStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = storage.write_batch(5, "generate", _batch())
    storage.record_stage(5, "generate", {"p": "1"}, {"batch": first})
    manifest_before = storage.read_manifest(5)

    with monkeypatch.context() as patch:
        _fail_commit(storage, patch)
        # Each write gives up after a second, not the session's 8 s: the retrying within
        # the budget is test_outage.py's, this test is about what a failed write leaves.
        patch.setenv(BUDGET_ENV, "1")
        with pytest.raises(StorageError, match="iter_000005/reward/batch.arrow"):
            storage.write_batch(5, "reward", _batch(8))
        with pytest.raises(StorageError, match="MANIFEST.json"):
            storage.record_stage(5, "reward", {"g": "x"}, {"batch": first})

    storage.fs.invalidate_cache()
    assert not storage.fs.exists(f"{storage.objects.run_path}/iter_000005/reward/batch.arrow")
    reward_dir = f"{storage.objects.run_path}/iter_000005/reward"
    leftovers = storage.fs.ls(reward_dir, detail=False) if storage.fs.exists(reward_dir) else []
    assert leftovers == []
    assert storage.read_manifest(5) == manifest_before
    assert storage.completed_stage(5, "reward", {"g": "x"}) is None
    assert storage.completed_stage(5, "generate", {"p": "1"}) is not None


def test_unreachable_s3_raises_storage_error_naming_the_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "key": "k",
        "secret": "s",
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
    }
    monkeypatch.setenv(BUDGET_ENV, "1")  # the message is the point, not the retrying
    storage = RunStorage("s3://nowhere/prefix", "run-x", storage_options=options)
    with pytest.raises(StorageError, match=r"s3://nowhere/prefix/runs/run-x/config\.yaml"):
        storage.read_run_config()


def _raw_put(storage: RunStorage, key: str, data: bytes) -> None:
    """Write behind the storage's back, as a crashed writer would have left it."""
    path = f"{storage.objects.run_path}/{key}"
    storage.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    storage.fs.pipe_file(path, data)


def _make_checkpoint(tmp_path: Path, step: int) -> Path:
    local = tmp_path / f"ckpt-src-{step}"
    (local / "policy" / "weights").mkdir(parents=True)
    (local / "policy" / "weights" / "model.safetensors").write_bytes(bytes([step]) * 100)
    (local / "policy" / "config.json").write_text(json.dumps({"step": step}))
    return local


def test_checkpoints_commit_fetch_and_info(storage: RunStorage, tmp_path: Path) -> None:
    assert storage.latest_checkpoint() is None
    url = storage.write_checkpoint(3, _make_checkpoint(tmp_path, 3), {"step": 3, "val_reward": 0.5})
    assert url.endswith("/runs/run-1/checkpoints/step_000003")
    assert storage.committed_checkpoints() == [3]
    assert storage.latest_checkpoint() == 3
    assert storage.read_checkpoint_info(3) == {"step": 3, "val_reward": 0.5}

    fetched = storage.fetch_checkpoint(3, tmp_path / "fetched")
    assert (fetched / "policy" / "weights" / "model.safetensors").read_bytes() == bytes([3]) * 100
    assert json.loads((fetched / "policy" / "config.json").read_text()) == {"step": 3}
    assert (fetched / "COMMITTED").exists()
    # On local disk this is the stored checkpoint; elsewhere a temporary copy the caller owns.
    in_place = storage.fetch_checkpoint(3)
    try:
        assert (in_place / "training_info.json").exists()
    finally:
        if not in_place.is_relative_to(tmp_path):
            shutil.rmtree(in_place)
    with pytest.raises(StorageError, match="step_000004"):
        storage.fetch_checkpoint(4)


def test_uncommitted_checkpoint_is_invisible(storage: RunStorage, tmp_path: Path) -> None:
    storage.write_checkpoint(1, _make_checkpoint(tmp_path, 1), {"step": 1})
    # A crash after the files but before COMMITTED: the same files, no marker.
    _raw_put(storage, "checkpoints/step_000002/policy/x.bin", b"partial")
    assert storage.committed_checkpoints() == [1]
    assert storage.latest_checkpoint() == 1


def test_prune_keeps_top_k_by_metric_and_always_the_newest(
    storage: RunStorage, tmp_path: Path
) -> None:
    rewards = {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.2}
    for step, reward in rewards.items():
        storage.write_checkpoint(step, _make_checkpoint(tmp_path, step), {"val_reward": reward})
    _raw_put(storage, "checkpoints/step_000000/policy/x.bin", b"partial")  # uncommitted, old
    assert storage.prune_checkpoints(None).deleted == []
    retention = storage.prune_checkpoints(2, metric_name="val_reward", higher_is_better=True)
    assert retention.deleted == [0, 2]  # top-2 are 1 and 3; 4 is the newest and stays
    assert retention.kept == storage.committed_checkpoints() == [1, 3, 4]
    assert storage.prune_checkpoints(1).deleted == [1, 3]  # no metric: the newest is the top
    assert storage.committed_checkpoints() == [4]


def test_prune_spares_the_newest_that_async_rollouts_generate_from(
    storage: RunStorage, tmp_path: Path
) -> None:
    for step in (1, 2, 3, 4, 5):
        storage.write_checkpoint(step, _make_checkpoint(tmp_path, step), {"step": step})
    # async GRPO with max_trajectory_age_steps=2 keeps 3; off-period ones too while in use
    retention = storage.prune_checkpoints(1, save_period=2, keep_newest=3)
    assert retention.deleted == [1, 2]
    assert retention.kept == storage.committed_checkpoints() == [3, 4, 5]
    assert storage.prune_checkpoints(1).deleted == [3, 4]


def test_prune_ranks_a_checkpoint_without_the_metric_last_as_nemo_rl_does(
    storage: RunStorage, tmp_path: Path
) -> None:
    infos = {1: {"val:loss": 0.5}, 2: {}, 3: {"val:loss": 0.9}, 4: {}}
    for step, info in infos.items():
        storage.write_checkpoint(step, _make_checkpoint(tmp_path, step), info)
    retention = storage.prune_checkpoints(2, metric_name="val:loss", higher_is_better=False)
    assert retention.deleted == [2]
    assert retention.kept == [1, 3, 4]  # the best losses, and the newest (never deleted)
    retention = storage.prune_checkpoints(1, metric_name="val:loss", higher_is_better=False)
    assert retention.deleted == [3]


def test_lease_excludes_other_owners_until_released_or_expired(storage: RunStorage) -> None:
    with storage.acquire_lease("flow-run-a", ttl_s=60) as lease:
        with pytest.raises(LeaseHeldError, match="flow-run-a") as info:
            storage.acquire_lease("flow-run-b")
        assert "until" in str(info.value)
        lease.renew()
    other = storage.acquire_lease("flow-run-b", ttl_s=0.5)  # released, so free
    time.sleep(0.6)
    taker = storage.acquire_lease("flow-run-c", ttl_s=60)  # expired, so taken over
    with pytest.raises(LeaseHeldError, match="flow-run-c"):
        other.renew()
    other.release()  # not ours any more: leaves the holder alone
    with pytest.raises(LeaseHeldError, match="flow-run-c"):
        storage.acquire_lease("flow-run-d")
    taker.release()


def test_a_second_writer_is_seen_at_once(
    storage_root: tuple[str, dict | None], tmp_path: Path
) -> None:
    """Another process's writes show up: no stale directory listings."""
    root, options = storage_root
    reader = RunStorage(root, "shared", storage_options=options)
    other = {**options, "skip_instance_cache": True} if options else None
    writer = RunStorage(root, "shared", storage_options=other)
    assert reader.committed_checkpoints() == [] and reader.iterations() == []
    writer.write_checkpoint(1, _make_checkpoint(tmp_path, 1), {"step": 1})
    writer.write_json(4, "train", "metrics", {})
    assert reader.committed_checkpoints() == [1] and reader.iterations() == [4]
    writer.write_checkpoint(2, _make_checkpoint(tmp_path, 2), {"step": 2})
    assert reader.latest_checkpoint() == 2


def test_errors_never_show_credentials(s3_server) -> None:  # type: ignore[no-untyped-def]
    secret = "SUPERSECRET-do-not-log"
    options = {**s3_server.storage_options, "secret": secret}
    storage = RunStorage("s3://missing-bucket-xyz/p", "run-1", storage_options=options)
    assert secret not in repr(storage) and secret not in storage.run_url
    with pytest.raises(StorageError) as info:
        storage.write_json(0, "train", "metrics", {})
    assert secret not in str(info.value)


def test_a_committed_checkpoint_gets_the_umask_modes(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path), "modes")
    with storage.staged_checkpoint(1) as local:
        (local / "model.safetensors").write_bytes(b"w")
        (local / "model.safetensors").chmod(0o600)  # as some writers leave it
        (local / "optimizer").mkdir()
        storage.write_checkpoint(1, local, {})
    step = tmp_path / "runs" / "modes" / "checkpoints" / "step_000001"
    umask = os.umask(0o022)
    os.umask(umask)
    assert (step / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    assert step.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (step / "optimizer").stat().st_mode & 0o777 == 0o777 & ~umask


def test_names_longer_than_every_store_takes_are_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="300 characters, at most 128"):
        RunStorage(str(tmp_path), "r" * 300)
    assert not (tmp_path / "runs").exists()


def test_verify_names_damaged_outputs_and_checkpoint_files(tmp_path: Path) -> None:
    from nemo_rl_core.utils.checkpoint import recorded_files

    storage = RunStorage(str(tmp_path), "verify")
    batch = BatchedDataDict({"x": torch.arange(8, dtype=torch.float32)})
    ref = storage.write_batch(0, "reward", batch)
    storage.record_stage(0, "reward", {}, {"batch": ref})
    with storage.staged_checkpoint(1) as local:
        (local / "model.safetensors").write_bytes(b"weights")
        (local / "optimizer").mkdir()
        (local / "optimizer" / "state.pt").write_bytes(b"moments")
        files = {k: v.model_dump() for k, v in recorded_files(local).items()}
        storage.write_checkpoint(1, local, {"files": files})
    found = storage.verify()
    assert found.intact and found.damaged == [] and found.checked == 3

    run_dir = tmp_path / "runs" / "verify"
    flip_a_byte(run_dir / ref.key)
    (run_dir / "checkpoints" / "step_000001" / "optimizer" / "state.pt").unlink()
    problems = storage.verify().damaged
    assert len(problems) == 2
    assert f"{ref.key} has sha256" in problems[0] and ref.sha256 in problems[0]
    assert problems[0].endswith("(iteration 0 stage reward)")
    assert "optimizer/state.pt is missing (expected 7 bytes)" in problems[1]
    assert problems[1].endswith("(committed checkpoint 1)")


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(data))


def test_verify_checks_stale_entries_and_parts_too_and_says_they_are_stale(
    tmp_path: Path,
) -> None:
    """A rerun marked the stage stale: a continue recomputes it, but until then its bytes
    are read (by a rerun of a later stage, by a person), and damage there is damage."""
    storage = RunStorage(str(tmp_path), "stale")
    batch = BatchedDataDict({"x": torch.arange(8, dtype=torch.float32)})
    logprob = storage.write_batch(0, "logprob", batch)
    storage.record_stage(0, "logprob", {}, {"batch": logprob})
    shard = storage.write_batch(0, "generate", batch, name="shard-0-of-2.batch")
    storage.record_part(0, "generate", "shard-0-of-2", {}, {"batch": shard})
    storage.mark_stale(0, ["logprob", "generate"])
    found = storage.verify()
    assert found.intact and found.checked == 2
    assert found.stale == [
        "iteration 0 stage logprob: stale (marked to be redone), 1 output(s) checked",
        "iteration 0 stage generate/shard-0-of-2: stale (marked to be redone), 1 output(s) checked",
    ]

    run_dir = tmp_path / "runs" / "stale"
    flip_a_byte(run_dir / logprob.key)
    flip_a_byte(run_dir / shard.key)
    [stage, part] = storage.verify().damaged
    assert f"{logprob.key} has sha256" in stage
    assert stage.endswith(
        "(iteration 0 stage logprob, a stale entry: the next continue recomputes it)"
    )
    assert f"{shard.key} has sha256" in part and "stage generate/shard-0-of-2, a stale" in part


def test_verify_names_a_manifest_it_cannot_read_and_checks_the_rest(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path), "torn")
    for iteration in (0, 1):
        ref = storage.write_json(iteration, "train", "metrics", {"loss": 1.0})
        storage.record_stage(iteration, "train", {}, {"metrics": ref})
    (tmp_path / "runs" / "torn" / "iter_000000" / "MANIFEST.json").write_text('{"stag')
    found = storage.verify()
    [problem] = found.damaged
    assert problem.startswith(f"{tmp_path}/runs/torn/iter_000000/MANIFEST.json: its record ")
    assert found.checked == 1  # iteration 1's output


@pytest.mark.parametrize("racers", [2, 8])
def test_exactly_one_of_racing_runs_takes_the_lease(
    storage_root: tuple[str, dict | None], racers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each racer reads the lease, finds it free and writes: with a slow store every racer
    reads before any writes, so only the store's conditional write can pick one."""
    root, options = storage_root
    for cls in (LocalObject, S3Object):
        read = cls.read

        def slow_read(self, read=read):
            found = read(self)
            time.sleep(0.2)  # storage latency between the read and the write
            return found

        monkeypatch.setattr(cls, "read", slow_read)
    start = threading.Barrier(racers)
    winners, refused = [], []

    def race(racer: int) -> None:
        storage = RunStorage(root, "raced", storage_options=options)
        start.wait()
        try:
            storage.acquire_lease(f"run-{racer}", ttl_s=60)
            winners.append(racer)
        except LeaseHeldError as err:
            refused.append(str(err))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1, winners
    assert len(refused) == racers - 1
    assert all(f"leased by 'run-{winners[0]}'" in message for message in refused)


def test_a_holder_whose_lease_was_taken_commits_nothing_more(
    storage_root: tuple[str, dict | None],
) -> None:
    root, options = storage_root
    storage = RunStorage(root, "taken", storage_options=options)
    lease = storage.acquire_lease("first", ttl_s=0.2)
    time.sleep(0.3)
    RunStorage(root, "taken", storage_options=options).acquire_lease("second", ttl_s=60)
    with pytest.raises(LeaseLostError, match="lost its lease to 'second'"):
        lease.renew()
    with pytest.raises(LeaseLostError, match="'second'"):
        storage.record_stage(0, "reward", {}, {})
    assert storage.read_manifest(0).stages == {}


def _s3_requests(storage: RunStorage, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The S3 methods ``storage`` calls from now on, in order (a list that fills up)."""
    calls: list[str] = []
    call_s3 = type(storage.fs)._call_s3

    async def counted(fs, method, *args, **kwargs):
        calls.append(method)
        return await call_s3(fs, method, *args, **kwargs)

    monkeypatch.setattr(type(storage.fs), "_call_s3", counted)
    return calls


def test_a_small_object_on_s3_is_one_request_to_read(
    s3_server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a manifest, a small batch or a missing object is one GET, not a HEAD (and a
    listing, when the key is missing) before it: every stage reads several per commit."""
    storage = RunStorage(
        f"s3://{s3_bucket}/prefix", "run-1", storage_options=dict(s3_server.storage_options)
    )
    ref = storage.write_batch(0, "generate", _batch())
    storage.record_stage(0, "generate", {"config": "c"}, {"batch": ref})
    storage.forget_writes()
    calls = _s3_requests(storage, monkeypatch)
    storage.read_batch(ref)
    assert storage.completed_stage(0, "generate", {"config": "c"}) is not None
    assert storage.read_manifest(1) == Manifest({})
    assert calls == ["get_object"] * 4  # batch; manifest + its output checked; no manifest


def test_a_stage_output_read_in_the_process_that_wrote_it_is_not_downloaded(
    s3_server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next stage in the writing process takes the output's bytes from memory (its
    reference names them by sha256), each read a private copy; a stage checking whether
    an earlier run's output is intact, and a process that forgot, read the store."""
    storage = RunStorage(
        f"s3://{s3_bucket}/prefix", "run-1", storage_options=dict(s3_server.storage_options)
    )
    ref = storage.write_batch(0, "generate", _batch())
    metrics = storage.write_json(0, "generate", "metrics", {"mean": 0.5})
    storage.record_stage(0, "generate", {"config": "c"}, {"batch": ref})
    calls = _s3_requests(storage, monkeypatch)
    first = storage.read_batch(ref)
    first["input_ids"].add_(1)  # decoded tensors may be written
    assert torch.equal(storage.read_batch(ref)["input_ids"], _batch()["input_ids"])
    assert storage.read_json(metrics) == {"mean": 0.5}
    assert calls == []
    assert storage.completed_stage(0, "generate", {"config": "c"}) is not None
    assert calls == ["get_object"]  # its output, checked on the store; the manifest it wrote
    calls.clear()
    storage.forget_writes()
    storage.read_batch(ref)
    assert calls == ["get_object"]


def test_listing_and_pruning_checkpoints_on_s3_take_one_request_each(
    s3_server, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint stage lists and prunes every iteration: one listing answers which
    steps are committed however many there are, and pruning by age reads no training info."""
    storage = RunStorage(
        f"s3://{s3_bucket}/prefix", "run-1", storage_options=dict(s3_server.storage_options)
    )
    for step in (1, 2, 3):
        storage.write_checkpoint(step, _make_checkpoint(tmp_path, step), {"step": step})
    _raw_put(storage, "checkpoints/step_000004/policy/x.bin", b"partial")  # no COMMITTED yet
    calls = _s3_requests(storage, monkeypatch)
    assert storage.committed_checkpoints() == [1, 2, 3]
    assert calls == ["list_objects_v2"]
    calls.clear()
    assert storage.prune_checkpoints(None).kept == [1, 2, 3]
    assert storage.prune_checkpoints(3).deleted == []
    assert calls == ["list_objects_v2"] * 2
    assert storage.prune_checkpoints(2).deleted == [1]
    assert storage.committed_checkpoints() == [2, 3]


def test_the_stages_of_an_iteration_on_s3_read_its_manifest_once(
    s3_server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first stage reads the manifest (is it done already?); each commit writes it on
    condition that it is still the version this process knows, which the next stage asks
    about without reading it again: one PUT a stage, one GET an iteration."""
    options = dict(s3_server.storage_options)
    storage = RunStorage(f"s3://{s3_bucket}/prefix", "run-1", storage_options=options)
    ref = storage.write_batch(0, "generate", _batch())
    storage.forget_writes()
    calls = _s3_requests(storage, monkeypatch)
    for stage in ("generate", "reward", "logprob"):
        assert storage.completed_stage(0, stage, {"config": "c"}) is None
        storage.record_stage(0, stage, {"config": "c"}, {"batch": ref})
    assert calls == ["get_object"] + ["put_object"] * 3
    assert set(storage.read_manifest(0).stages) == {"generate", "reward", "logprob"}


def test_an_iteration_past_the_planning_listing_is_started_without_a_read(
    s3_server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver lists its iterations when it plans them: a later one has no manifest,
    so its first stage asks without a GET; one the listing showed is read; a commit by
    another process meanwhile still lands beside this one's (the write is conditional)."""
    options = dict(s3_server.storage_options)
    storage = RunStorage(f"s3://{s3_bucket}/prefix", "run-1", storage_options=options)
    elsewhere = RunStorage(f"s3://{s3_bucket}/prefix", "run-1", storage_options=options)
    ref = storage.write_batch(0, "generate", _batch())
    storage.record_stage(0, "generate", {"config": "c"}, {"batch": ref})
    storage.forget_writes()
    assert storage.iterations() == [0]
    calls = _s3_requests(storage, monkeypatch)
    assert storage.completed_stage(0, "generate", {"config": "c"}) is not None
    assert calls == ["get_object"] * 2  # listed: its manifest read, its output checked
    calls.clear()
    assert storage.completed_stage(1, "prompts", {"config": "c"}) is None
    assert calls == []  # past the listing: known absent
    elsewhere.record_stage(1, "generate", {"config": "c"}, {"batch": ref})
    storage.record_stage(1, "prompts", {"config": "c"}, {"batch": ref})
    assert set(elsewhere.read_manifest(1).stages) == {"prompts", "generate"}
    calls.clear()
    storage.forget_writes()  # known absent no more: read again
    assert storage.completed_stage(2, "prompts", {"config": "c"}) is None
    assert calls == ["get_object"]


def _reward_committed_elsewhere(
    s3_server, s3_bucket: str
) -> tuple[RunStorage, RunStorage, ObjectRef]:
    """Two processes' storages of one run on S3: ``here`` committed generate, then
    ``elsewhere`` committed reward into the same manifest; and generate's output."""
    options = dict(s3_server.storage_options)
    here = RunStorage(f"s3://{s3_bucket}/prefix", "run-1", storage_options=options)
    elsewhere = RunStorage(f"s3://{s3_bucket}/prefix", "run-1", storage_options=options)
    ref = here.write_batch(0, "generate", _batch())
    here.record_stage(0, "generate", {"config": "c"}, {"batch": ref})
    elsewhere.record_stage(0, "reward", {"config": "c"}, {"batch": ref})
    return here, elsewhere, ref


def test_a_stage_done_by_another_process_is_done_again_and_committed_once(
    s3_server, s3_bucket: str
) -> None:
    """This process's manifest is older than the store's: the stage counts as not done,
    and its commit, on condition of the old version, reads the new one and keeps both."""
    here, elsewhere, ref = _reward_committed_elsewhere(s3_server, s3_bucket)
    assert here.completed_stage(0, "reward", {"config": "c"}) is None
    here.record_stage(0, "reward", {"config": "c"}, {"batch": ref}, {"again": 1})
    stages = elsewhere.read_manifest(0).stages
    assert set(stages) == {"generate", "reward"} and stages["reward"].metrics == {"again": 1}
    here.forget_writes()  # a new flow run: what the store holds
    assert here.completed_stage(0, "reward", {"config": "c"}) is not None


def test_a_manifest_changed_by_another_process_is_read_again_before_the_commit(
    s3_server, s3_bucket: str
) -> None:
    """A stage placed on another pool commits into the same manifest between this
    process's read and its commit: the conditional write fails, and the commit keeps both."""
    here, elsewhere, ref = _reward_committed_elsewhere(s3_server, s3_bucket)
    here.record_stage(0, "logprob", {"config": "c"}, {"batch": ref})
    assert set(here.read_manifest(0).stages) == {"generate", "reward", "logprob"}
    here.mark_stale(0, ["reward"])
    elsewhere.record_stage(0, "train", {"config": "c"}, {"batch": ref})
    manifest = elsewhere.read_manifest(0)
    assert set(manifest.stages) == {"generate", "reward", "logprob", "train"}
    assert manifest.stale_stages() == ["reward"]


def test_a_long_run_on_s3_commits_into_old_iterations_still(s3_server, s3_bucket: str) -> None:
    """The manifest versions a storage remembers are those of its newest iterations; a
    commit into an older one reads it first and keeps what it held."""
    options = dict(s3_server.storage_options)
    storage = RunStorage(f"s3://{s3_bucket}/prefix", "run-1", storage_options=options)
    ref = storage.write_batch(0, "generate", _batch())
    for iteration in range(12):
        storage.record_stage(iteration, "generate", {"config": "c"}, {"batch": ref})
    storage.record_stage(0, "reward", {"config": "c"}, {"batch": ref})
    assert set(storage.read_manifest(0).stages) == {"generate", "reward"}
    assert all(storage.read_manifest(i).stages.keys() == {"generate"} for i in range(1, 12))


def test_a_stages_outputs_are_written_together_and_come_back_in_order(
    storage: RunStorage,
) -> None:
    """A batch and a dict output, as a shard writes them (``<part>.<name>``); a later output
    that cannot be written fails the call, though the first was written meanwhile."""
    batch = _batch()
    refs = storage.write_outputs(2, "prompts", {"batch": batch, "state": {"epoch": 1}}, "p0.")
    assert list(refs) == ["batch", "state"]
    assert [ref.key for ref in refs.values()] == [
        "iter_000002/prompts/p0.batch.arrow",
        "iter_000002/prompts/p0.state.json",
    ]
    storage.forget_writes()  # read them back from the store
    assert torch.equal(storage.read_batch(refs["batch"])["input_ids"], batch["input_ids"])
    assert storage.read_json(refs["state"]) == {"epoch": 1}
    with pytest.raises(TypeError, match="not JSON serializable"):
        storage.write_outputs(3, "prompts", {"batch": batch, "state": {"x": object()}})
