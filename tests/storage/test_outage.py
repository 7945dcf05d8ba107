"""A store that cannot be reached: every failed try is logged with the time left, and the
whole wait is one budget, after which the error says so and nothing retries it again."""

import logging
import time

import pytest

from nemo_rl_core.storage.outage import StorageUnreachableError, retry_within_budget
from nemo_rl_core.storage.run_storage import RunStorage
from tasks.stage import is_transient


class Flaky:
    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "ok"


def test_each_failed_try_is_logged_and_a_recovery_returns(caplog) -> None:
    op = Flaky(3, ConnectionResetError("reset by peer"))
    with caplog.at_level(logging.WARNING, logger="nemo_rl_core.storage"):
        got = retry_within_budget(op, "put s3://b/x", (OSError,), budget_s=60, sleep=lambda s: None)
    assert got == "ok" and op.calls == 4
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("put s3://b/x failed" in line for line in lines)
    assert "try 3" in lines[-1] and "reset by peer" in lines[-1]


def test_the_budget_bounds_the_wait_and_ends_retrying() -> None:
    started = time.monotonic()
    with pytest.raises(StorageUnreachableError, match=r"unreachable for 1 s over \d+ tries"):
        retry_within_budget(Flaky(10**6, TimeoutError("timed out")), "get x", (OSError,), 1.0)
    assert time.monotonic() - started < 3

    class State:
        data = StorageUnreachableError("budget spent")

    assert not is_transient(None, None, State())


def test_answers_are_not_retried() -> None:
    op = Flaky(1, FileNotFoundError("no such key"))
    with pytest.raises(FileNotFoundError):
        retry_within_budget(op, "get x", (OSError,), budget_s=60, sleep=lambda s: None)
    assert op.calls == 1


def test_an_unreachable_s3_endpoint_fails_within_the_budget(monkeypatch, caplog) -> None:
    monkeypatch.setenv("NEMO_RL_CORE_STORAGE_BUDGET_S", "3")
    storage = RunStorage(
        "s3://nowhere",
        "outage",
        storage_options={
            "key": "k",
            "secret": "s",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9"},  # nothing listens
        },
    )
    started = time.monotonic()
    unreachable = pytest.raises(StorageUnreachableError, match="s3://nowhere/runs/outage/")
    with caplog.at_level(logging.WARNING, logger="nemo_rl_core.storage"), unreachable:
        storage.write_run_config({"a": 1})
    assert time.monotonic() - started < 20
    assert any("s3://nowhere/runs/outage" in r.getMessage() for r in caplog.records)
