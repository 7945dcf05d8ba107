"""Wall-clock timers of NeMo RL (``nemo_rl.utils.timer``): ``Timer`` and ``TimeoutChecker``.

Interfaces accept an optional ``Timer`` so callers can attribute time to sub-steps (data
movement vs. compute) without each backend inventing its own bookkeeping. A
``TimeoutChecker`` tells a training loop when to save a last checkpoint before a job's
wall-clock allowance (a cluster's time limit) runs out.
"""

import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import numpy as np

_REDUCTIONS: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": np.mean,
    "median": np.median,
    "min": np.min,
    "max": np.max,
    "std": np.std,
    "sum": np.sum,
    "count": len,
}


class Timer:
    """Elapsed seconds per label, every measurement kept so they can be reduced later.

    ``start``/``stop`` or ``with timer.time(label):``; a label timed in a loop collects one
    measurement per pass, which ``reduce(label, "mean")`` (or median, min, max, std, sum,
    count) summarizes.
    """

    def __init__(self) -> None:
        self._timers: dict[str, list[float]] = {}
        self._start_times: dict[str, float] = {}

    def start(self, label: str) -> None:
        if label in self._start_times:
            raise ValueError(f"Timer '{label}' is already running")
        self._start_times[label] = time.perf_counter()

    def stop(self, label: str) -> float:
        """Record and return the seconds since ``start(label)``."""
        if label not in self._start_times:
            running = ", ".join(self._start_times) or "none"
            raise ValueError(f"Timer '{label}' is not running (running: {running})")
        elapsed = time.perf_counter() - self._start_times.pop(label)
        self._timers.setdefault(label, []).append(elapsed)
        return elapsed

    @contextmanager
    def time(self, label: str) -> Iterator[None]:
        self.start(label)
        try:
            yield
        finally:
            self.stop(label)

    def get_elapsed(self, label: str) -> list[float]:
        """Every measurement of ``label``, oldest first (``KeyError`` if there is none)."""
        return self._measurements(label)

    def get_latest_elapsed(self, label: str) -> float:
        measurements = self._measurements(label)
        if not measurements:
            raise IndexError(f"No measurements recorded for '{label}'")
        return measurements[-1]

    def reduce(self, label: str, operation: str = "mean") -> float:
        """One number for ``label``: mean, median, min, max, std, sum or count."""
        if operation not in _REDUCTIONS:
            raise ValueError(
                f"Invalid operation '{operation}'. Valid options are: {', '.join(_REDUCTIONS)}"
            )
        return _REDUCTIONS[operation](self._measurements(label))

    def get_timing_metrics(
        self, reduction_op: str | Mapping[str, str] = "mean"
    ) -> dict[str, float | list[float]]:
        """Every label, reduced by ``reduction_op``: one operation for all labels, or a
        mapping label -> operation (labels it leaves out keep all their measurements)."""
        ops = (
            dict.fromkeys(self._timers, reduction_op)
            if isinstance(reduction_op, str)
            else reduction_op
        )
        unknown = sorted({op for op in ops.values() if op not in _REDUCTIONS})
        if unknown:
            raise ValueError(
                f"Invalid operation(s) {unknown}. Valid options are: {', '.join(_REDUCTIONS)}"
            )
        return {
            label: self.reduce(label, ops[label]) if label in ops else values
            for label, values in self._timers.items()
        }

    def reset(self, label: str | None = None) -> None:
        """Forget ``label`` (measurements and a running start), or everything."""
        if label is None:
            self._timers = {}
            self._start_times = {}
        else:
            self._timers.pop(label, None)
            self._start_times.pop(label, None)

    def _measurements(self, label: str) -> list[float]:
        if label not in self._timers:
            raise KeyError(f"No timings recorded for '{label}'")
        return self._timers[label]


_TIMEOUT = re.compile(r"(\d+):(\d+):(\d+):(\d+)")


def convert_to_seconds(time_string: str) -> int:
    """``"DD:HH:MM:SS"`` (e.g. ``"00:03:45:00"``) as seconds."""
    match = _TIMEOUT.fullmatch(time_string.strip())
    if match is None:
        raise ValueError(
            f"timeout {time_string!r} is not DD:HH:MM:SS (e.g. '00:03:45:00' for 3 h 45 min)"
        )
    days, hours, minutes, seconds = (int(part) for part in match.groups())
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


class TimeoutChecker:
    """Says once, when ``timeout`` has passed since construction, that it is time to save.

    With ``fit_last_save_time`` it says so one average iteration early (iterations timed by
    ``start_iterations``/``mark_iteration``), so the save still fits before the limit.
    ``timeout=None`` never expires.
    """

    def __init__(self, timeout: str | None = "00:03:45:00", fit_last_save_time: bool = False):
        self.last_save_time = float("inf") if timeout is None else convert_to_seconds(timeout)
        self.fit_last_save_time = fit_last_save_time
        self.start_time = time.time()
        self.last_saved = False
        self.iteration_times: list[float] = []
        self.previous_iteration_time: float | None = None

    def check_save(self) -> bool:
        """True exactly once: the first call at or past the deadline."""
        sys.stdout.flush()  # what was printed before a job is killed should reach its log
        sys.stderr.flush()
        if self.last_saved:
            return False
        elapsed = time.time() - self.start_time
        if self.fit_last_save_time and self.iteration_times:
            elapsed += sum(self.iteration_times) / len(self.iteration_times)
        if elapsed >= self.last_save_time:
            self.last_saved = True
            return True
        return False

    def start_iterations(self) -> None:
        self.previous_iteration_time = time.time()

    def mark_iteration(self) -> None:
        """Record the seconds since the previous mark (or ``start_iterations``)."""
        sys.stdout.flush()
        sys.stderr.flush()
        if self.previous_iteration_time is None:
            raise RuntimeError("TimeoutChecker.mark_iteration() before start_iterations()")
        now = time.time()
        self.iteration_times.append(now - self.previous_iteration_time)
        self.previous_iteration_time = now
