"""A named wall-clock timer, as NeMo RL's ``nemo_rl.utils.timer.Timer``.

Interfaces accept an optional timer so callers can attribute time to sub-steps
(e.g. data movement vs. compute) without each backend inventing its own bookkeeping.
"""

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager


class Timer:
    """Accumulates elapsed seconds under labels; ``time(label)`` is a context manager."""

    def __init__(self) -> None:
        self._starts: dict[str, float] = {}
        self._elapsed: dict[str, list[float]] = defaultdict(list)

    def start(self, label: str) -> None:
        if label in self._starts:
            raise ValueError(f"timer {label!r} is already running")
        self._starts[label] = time.perf_counter()

    def stop(self, label: str) -> float:
        if label not in self._starts:
            raise ValueError(f"timer {label!r} was never started")
        elapsed = time.perf_counter() - self._starts.pop(label)
        self._elapsed[label].append(elapsed)
        return elapsed

    @contextmanager
    def time(self, label: str) -> Iterator[None]:
        self.start(label)
        try:
            yield
        finally:
            self.stop(label)

    def get_elapsed(self, label: str) -> list[float]:
        return list(self._elapsed.get(label, []))

    def get_timing_metrics(self, reduction_op: str = "sum") -> dict[str, float]:
        """Reduce each label's measurements with ``sum``, ``mean``, ``min`` or ``max``."""
        ops = {"sum": sum, "min": min, "max": max, "mean": lambda v: sum(v) / len(v)}
        if reduction_op not in ops:
            raise ValueError(f"reduction_op must be one of {sorted(ops)}, got {reduction_op!r}")
        return {label: ops[reduction_op](values) for label, values in self._elapsed.items()}

    def reset(self, label: str | None = None) -> None:
        if label is None:
            self._starts.clear()
            self._elapsed.clear()
        else:
            self._starts.pop(label, None)
            self._elapsed.pop(label, None)
