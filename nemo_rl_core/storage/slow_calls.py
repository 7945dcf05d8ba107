"""A word from every storage call that hangs instead of failing.

A stalled store (an S3 server paused mid-request, a hung mount) does not fail a call: it
keeps it waiting, up to the client's read timeout and then the outage budget's retries,
and a call that has not failed has nothing to log. An operator saw no line for a minute.

Each storage call registers with one monitor thread of the process for as long as it runs
(a dict insert under a lock: a fast call pays nothing more, and no thread is started per
call). A call still running after ``NEMO_RL_CORE_STORAGE_SLOW_S`` seconds (default 10) is
logged on the ``nemo_rl_core.storage`` logger with its operation and object, again every
``NEMO_RL_CORE_STORAGE_SLOW_REPEAT_S`` seconds (default 30) while it waits, and once more
when it returns or fails.
"""

import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SLOW_ENV = "NEMO_RL_CORE_STORAGE_SLOW_S"
REPEAT_ENV = "NEMO_RL_CORE_STORAGE_SLOW_REPEAT_S"
DEFAULT_SLOW_S = 10.0
DEFAULT_REPEAT_S = 30.0

log = logging.getLogger("nemo_rl_core.storage")


@dataclass
class _Call:
    operation: str  # "read"
    url: str  # "s3://bucket/runs/exp1/iter_000003/generate/batch.arrow"
    started: float
    due: float  # when it is next said to be waiting
    warned: bool = False


class SlowCallMonitor:
    """The calls in flight and the one thread that says which of them waits too long."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # the thread does not survive a fork

    def _reset(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count()
        self._wake_at = math.inf
        self._thread: threading.Thread | None = None
        self._local = threading.local()

    @contextmanager
    def watching(self, operation: str, url: str) -> Iterator[None]:
        """Register the call ``operation`` of ``url`` while the block runs (a call made inside
        another watched call of the same thread is the outer call's business)."""
        if getattr(self._local, "inside", False):
            yield
            return
        self._local.inside = True
        now = time.monotonic()
        call = _Call(operation, url, now, now + _slow_s())
        with self._condition:
            key = next(self._ids)
            self._calls[key] = call
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="storage-slow-calls", daemon=True
                )
                self._thread.start()
            if call.due < self._wake_at:  # only when the threshold was just lowered
                self._wake_at = call.due
                self._condition.notify()
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._local.inside = False
            self._end(key, error)

    def _end(self, key: int, error: BaseException | None) -> None:
        with self._condition:
            call = self._calls.pop(key)
        if call.warned:
            waited = time.monotonic() - call.started
            outcome = "returned" if error is None else f"failed ({type(error).__name__})"
            log.warning(
                "storage: %s of %s %s after %.1f s", call.operation, call.url, outcome, waited
            )

    def _watch(self) -> None:
        while True:
            with self._condition:
                now = time.monotonic()
                overdue = [call for call in self._calls.values() if call.due <= now]
                repeat_s = float(os.environ.get(REPEAT_ENV, DEFAULT_REPEAT_S)) if overdue else 0
                for call in overdue:
                    call.warned = True
                    call.due = now + repeat_s
                # Idle, it still wakes once per threshold: a call registered meanwhile is due
                # no sooner, so registering never has to wake it (no switch per call).
                idle_until = now + _slow_s()
                self._wake_at = min((call.due for call in self._calls.values()), default=idle_until)
                if not overdue:
                    self._condition.wait(self._wake_at - now)
                    continue
            for call in overdue:  # logged outside the lock: handlers may be slow
                log.warning(
                    "storage: %s of %s has waited %.1f s for the store (still waiting; the "
                    "store may be stalled or overloaded)",
                    call.operation,
                    call.url,
                    now - call.started,
                )


def _slow_s() -> float:
    return float(os.environ.get(SLOW_ENV, DEFAULT_SLOW_S))


MONITOR = SlowCallMonitor()
watching = MONITOR.watching
