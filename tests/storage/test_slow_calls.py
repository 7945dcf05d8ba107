"""The slow-call monitor: a storage call that waits is said while it waits (not only when it
ends), fast calls say nothing and start no thread of their own, and a call inside another
one of the same thread is the outer call's."""

import re
import threading
import time
from pathlib import Path

import pytest

from nemo_rl_core.storage.object_store import ObjectStore
from nemo_rl_core.storage.slow_calls import REPEAT_ENV, SLOW_ENV, SlowCallMonitor, watching


@pytest.fixture(autouse=True)
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOW_ENV, "0.3")
    monkeypatch.setenv(REPEAT_ENV, "0.4")


def storage_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[float, str]]:
    return [(r.created, r.getMessage()) for r in caplog.records if r.name == "nemo_rl_core.storage"]


def seconds_in(line: str, pattern: str) -> float:
    """The seconds a line says, where ``pattern`` (escaped) has ``{s}`` for them."""
    found = re.fullmatch(re.escape(pattern).replace(r"\{s\}", r"([0-9.]+)"), line)
    assert found, f"{line!r} is not {pattern!r}"
    return float(found.group(1))


def test_a_slow_call_is_said_while_it_waits_then_when_it_returns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = ObjectStore(str(tmp_path), "slow", None, "arrow")
    caplog.set_level("WARNING", logger="nemo_rl_core.storage")

    def slow_write() -> None:
        time.sleep(1.0)

    started = time.time()
    objects.call("write", "iter_000000/generate/batch.arrow", slow_write, reading=False)
    returned = time.time()

    url = f"{tmp_path}/runs/slow/iter_000000/generate/batch.arrow"
    lines = storage_lines(caplog)
    waiting = f"storage: write of {url} has waited {{s}} s for the store (still waiting; "
    waited = [seconds_in(line.split("the store may")[0], waiting) for _, line in lines[:-1]]
    assert len(waited) == 2 and 0.3 <= waited[0] < 0.6 and 0.7 <= waited[1] < 1.0, waited
    assert all(at < returned for at, _ in lines[:-1]), "said only after the call ended"
    assert lines[0][0] - started < 0.6
    took = seconds_in(lines[-1][1], f"storage: write of {url} returned after {{s}} s")
    assert 1.0 <= took < 1.5


def test_a_slow_call_that_fails_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="nemo_rl_core.storage")
    with pytest.raises(TimeoutError), watching("read", "s3://bucket/runs/r/config.yaml"):
        time.sleep(0.5)
        raise TimeoutError("read timed out")
    said = [line for _, line in storage_lines(caplog)]
    url = "s3://bucket/runs/r/config.yaml"
    assert (
        seconds_in(said[-1], f"storage: read of {url} failed (TimeoutError) after {{s}} s") >= 0.5
    )


def test_fast_calls_say_nothing_and_share_one_monitor_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = SlowCallMonitor()
    caplog.set_level("DEBUG", logger="nemo_rl_core.storage")
    with monitor.watching("read", "first"):
        pass
    threads = threading.active_count()
    for index in range(2000):
        with monitor.watching("read", f"object-{index}"):
            pass
    assert threading.active_count() == threads
    assert storage_lines(caplog) == []


def test_a_call_inside_another_is_the_outer_calls(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="nemo_rl_core.storage")
    with watching("write", "outer"), watching("put_object", "inner"):
        time.sleep(0.45)
    said = [line for _, line in storage_lines(caplog)]
    assert said and all(line.startswith("storage: write of outer ") for line in said), said
