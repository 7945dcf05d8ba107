"""A stalled store is not silent: on a real S3 server whose traffic is held mid-request (as a
paused server process holds it), a storage call that waits past the slow threshold is
logged with its operation and object while it waits, again at each repeat interval, and
once more when it returns. The thresholds are made small here by their settings."""

import re
import threading
import time
import uuid
from urllib.parse import urlparse

import pytest
import torch
from switchable_proxy import SwitchableProxy

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.storage.handles import RunRef, open_storage, use_storage_options

STALL_S = 4.0


@pytest.fixture
def stalling_run(s3_server, s3_bucket, monkeypatch: pytest.MonkeyPatch):
    """A run on S3 reached through a proxy that can hold the traffic; slow after 1 s, said
    again every 1.2 s."""
    monkeypatch.setenv("NEMO_RL_CORE_STORAGE_SLOW_S", "1")  # the settings an operator has
    monkeypatch.setenv("NEMO_RL_CORE_STORAGE_SLOW_REPEAT_S", "1.2")
    proxy = SwitchableProxy(urlparse(s3_server.endpoint_url).port)
    root = f"s3://{s3_bucket}/stall"
    use_storage_options(root, {**s3_server.storage_options, "endpoint_url": proxy.endpoint_url})
    run = RunRef(root, f"stall-{uuid.uuid4().hex[:6]}")
    yield run, proxy
    proxy.release()


def stalled(proxy: SwitchableProxy, call, caplog: pytest.LogCaptureFixture):
    """``call()`` while the store holds every request for ``STALL_S`` seconds; returns its
    result, the storage log lines with the seconds into the stall each came at, and how
    long the call took."""
    caplog.clear()
    proxy.hold()
    threading.Timer(STALL_S, proxy.release).start()
    started = time.time()
    with caplog.at_level("WARNING", logger="nemo_rl_core.storage"):
        result = call()
    took = time.time() - started
    lines = [
        (record.created - started, record.getMessage())
        for record in caplog.records
        if record.name == "nemo_rl_core.storage"
    ]
    return result, lines, took


def test_a_stalled_read_is_said_while_it_waits_and_when_it_returns(stalling_run, caplog) -> None:
    run, proxy = stalling_run
    storage = open_storage(run)
    batch = BatchedDataDict({"x": torch.arange(16, dtype=torch.float32)})
    ref = storage.write_batch(0, "generate", batch)
    storage.forget_writes()  # read it from the store, not from this process's memory

    read, lines, took = stalled(proxy, lambda: storage.read_batch(ref), caplog)

    assert read["x"].equal(batch["x"])
    assert took >= STALL_S
    url = re.escape(f"{run.storage_root}/runs/{run.run_id}/{ref.key}")
    waiting = [(at, line) for at, line in lines if "has waited" in line]
    assert len(waiting) >= 3, lines  # at 1 s, 2.2 s, 3.4 s
    for _, line in waiting:
        assert re.match(rf"storage: read of {url} has waited [0-9.]+ s for the store", line)
    first_at = waiting[0][0]
    assert 0.9 <= first_at < 2.0, f"the first word came {first_at:.1f} s into the stall"
    assert re.fullmatch(rf"storage: read of {url} returned after [4-9]\.[0-9] s", lines[-1][1])


def test_a_stalled_commit_is_said_naming_the_manifest(stalling_run, caplog) -> None:
    run, proxy = stalling_run
    storage = open_storage(run)
    ref = storage.write_json(0, "train", "metrics", {"loss": 1.0})
    storage.read_manifest(0)  # the commit then writes at once, on condition of this version

    _, lines, _ = stalled(
        proxy, lambda: storage.record_stage(0, "train", {}, {"metrics": ref}), caplog
    )

    url = f"{run.storage_root}/runs/{run.run_id}/iter_000000/MANIFEST.json"
    said = [line for _, line in lines]
    assert said[0].startswith(f"storage: write of {url} has waited 1."), said
    assert said[-1].startswith(f"storage: write of {url} returned after"), said
    assert storage.read_manifest(0).complete("train") is not None
