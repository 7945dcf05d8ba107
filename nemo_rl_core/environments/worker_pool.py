"""A process pool where one stuck or crashing task costs one sample, never the run.

``concurrent.futures.ProcessPoolExecutor`` cannot cancel a running task and breaks the
whole pool when a worker dies. Reward checkers run untrusted model output through
parsers (sympy) that can hang for minutes on inputs like ``9^{9^{9}}``, so each task here
has a deadline: a worker past it is killed and replaced, a worker that dies is replaced,
and the task gets a failed ``TaskOutcome`` with the reason.
"""

import multiprocessing
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any


@dataclass(frozen=True)
class TaskOutcome:
    """The result of one task: ``value`` when ``ok``, else ``reason`` and its ``kind``."""

    ok: bool
    value: Any = None
    kind: str = ""  # "" | "timeout" | "error" | "died"
    reason: str = ""


def _worker_main(
    conn: Connection, parent_end: Connection, fn: Callable[[Any], Any], warmup_item: Any
) -> None:
    # The fork copied the parent's end of this pipe: closed here, the pipe reaches EOF when
    # the parent dies (even by SIGKILL), and the worker exits instead of lingering on.
    parent_end.close()
    # The fork copied the parent's signal handlers too (a Prefect task worker's SIGTERM
    # handler): a checker process ends on SIGTERM without running them.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if warmup_item is not None:
        fn(warmup_item)  # lazy imports and parser tables load here, not on a timed task
    conn.send(("ready", None))
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", fn(item)))
        except Exception as err:  # the task fails, the worker lives on
            conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"))


class _Worker:
    def __init__(self, ctx: multiprocessing.context.ForkContext, fn: Callable, warmup_item: Any):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_main, args=(child, self.conn, fn, warmup_item), daemon=True
        )
        self.process.start()
        child.close()
        self.ready = False
        self.started = time.monotonic()
        self.task: int | None = None
        self.deadline = 0.0

    def poll_ready(self, startup_timeout_s: float) -> None:
        """Mark the worker ready once its warm-up finished; fail if it never does."""
        if not self.ready and self.conn.poll():
            self.conn.recv()
            self.ready = True
        if not self.ready and (
            not self.process.is_alive() or time.monotonic() - self.started > startup_timeout_s
        ):
            self.kill()
            raise RuntimeError(
                f"a pool worker did not start within {startup_timeout_s:g}s "
                f"(exit code {self.process.exitcode}); its warm-up task failed or hung"
            )

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


class TimedProcessPool:
    """``num_workers`` processes running ``fn`` (a picklable top-level function).

    Workers are forked from the caller, so they start in milliseconds with whatever the
    caller already imported (prepare the parent, e.g. import and warm up the checker,
    before building the pool); a killed worker's replacement is as cheap. ``spawn`` and
    ``forkserver`` would re-import the caller's ``__main__`` (and its torch) in every
    worker: CPython's forkserver never preloads ``__main__``. Forking a parent that runs
    torch threads is safe here because workers only run ``fn``, never torch ops. Each
    worker first runs ``fn(warmup_item)`` untimed; the pool waits for all to be warm.
    Calls of ``map`` from several threads (a stage's concurrent shards) take turns: the
    workers are the pool's parallelism.
    """

    def __init__(
        self,
        fn: Callable[[Any], Any],
        num_workers: int,
        warmup_item: Any = None,
        startup_timeout_s: float = 300.0,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._fn = fn
        self._warmup_item = warmup_item
        self._startup_timeout_s = startup_timeout_s
        self._ctx = multiprocessing.get_context("fork")
        self._turn = threading.Lock()
        self._workers = [self._spawn() for _ in range(num_workers)]
        while not all(w.ready for w in self._workers):
            wait([w.conn for w in self._workers if not w.ready], timeout=1.0)
            for worker in self._workers:
                worker.poll_ready(startup_timeout_s)

    def _spawn(self) -> "_Worker":
        return _Worker(self._ctx, self._fn, self._warmup_item)

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    def map(self, items: Sequence[Any], timeout_s: float) -> list[TaskOutcome]:
        """Run ``fn`` on every item, each within ``timeout_s`` seconds of its start."""
        with self._turn:
            return self._map(items, timeout_s)

    def _map(self, items: Sequence[Any], timeout_s: float) -> list[TaskOutcome]:
        outcomes: list[TaskOutcome | None] = [None] * len(items)
        pending = list(range(len(items)))[::-1]
        while pending or any(w.task is not None for w in self._workers):
            for worker in self._workers:
                worker.poll_ready(self._startup_timeout_s)
                if worker.ready and worker.task is None and pending:
                    worker.task = pending.pop()
                    worker.deadline = time.monotonic() + timeout_s
                    worker.conn.send(items[worker.task])
            busy = [w for w in self._workers if w.task is not None]
            starting = [w.conn for w in self._workers if not w.ready]
            wait_for = min((w.deadline for w in busy), default=time.monotonic() + 1.0)
            watched: list[Connection | int] = [w.conn for w in busy]
            watched += [w.process.sentinel for w in busy]
            watched += starting
            ready = wait(
                watched,
                timeout=max(wait_for - time.monotonic(), 0.0),
            )
            for index, worker in enumerate(self._workers):
                if worker.task is None:
                    continue
                outcome = self._collect(worker, ready, timeout_s)
                if outcome is not None:
                    outcomes[worker.task] = outcome
                    worker.task = None
                    if outcome.kind in ("timeout", "died"):
                        self._workers[index] = self._spawn()
        return [o for o in outcomes if o is not None]

    def _collect(self, worker: _Worker, ready: list[Any], timeout_s: float) -> TaskOutcome | None:
        if worker.conn in ready:
            try:
                status, payload = worker.conn.recv()
            except (EOFError, OSError):
                pass  # died mid-send: reported below from its exit code
            else:
                if status == "ok":
                    return TaskOutcome(ok=True, value=payload)
                return TaskOutcome(ok=False, kind="error", reason=payload)
        if not worker.process.is_alive():
            worker.process.join(timeout=5)
            code = worker.process.exitcode
            worker.kill()
            return TaskOutcome(ok=False, kind="died", reason=f"worker died with exit code {code}")
        if time.monotonic() >= worker.deadline:
            worker.kill()
            return TaskOutcome(
                ok=False, kind="timeout", reason=f"timed out after {timeout_s:g}s (worker killed)"
            )
        return None

    def shutdown(self) -> None:
        for worker in self._workers:
            worker.kill()
        self._workers = []
