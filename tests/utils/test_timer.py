"""Timer reductions and errors, and the TimeoutChecker's one-shot save signal."""

import itertools
import time

import pytest

from nemo_rl_core.utils.timer import TimeoutChecker, Timer, convert_to_seconds


@pytest.fixture
def clock(monkeypatch):
    """A perf_counter whose start/stop pairs measure 0.5, 1.5, 2.5, 3.5, ... seconds."""
    steps = itertools.chain.from_iterable((10.0, d) for d in itertools.count(0.5, 1.0))
    readings = itertools.accumulate(steps)
    monkeypatch.setattr(time, "perf_counter", lambda: next(readings))


def test_measurements_reduce_per_label(clock):
    timer = Timer()
    for _ in range(3):  # generate takes 0.5, 2.5, 4.5 s; idle 1.5, 3.5, 5.5 s
        with timer.time("generate"):
            pass
        timer.start("idle")
        timer.stop("idle")
    assert timer.get_elapsed("generate") == [0.5, 2.5, 4.5]
    assert timer.get_latest_elapsed("generate") == 4.5
    assert timer.reduce("generate") == pytest.approx(2.5)
    expected = {"median": 2.5, "min": 0.5, "max": 4.5, "sum": 7.5, "count": 3}
    for operation, value in expected.items():
        assert timer.reduce("generate", operation) == pytest.approx(value)
    assert timer.reduce("generate", "std") == pytest.approx((8 / 3) ** 0.5)
    metrics = timer.get_timing_metrics({"generate": "max"})
    assert metrics == {"generate": 4.5, "idle": [1.5, 3.5, 5.5]}
    assert timer.get_timing_metrics("sum") == {"generate": 7.5, "idle": pytest.approx(10.5)}


def test_timer_errors_name_the_label_or_operation():
    timer = Timer()
    with pytest.raises(ValueError, match="'train' is not running"):
        timer.stop("train")
    timer.start("train")
    with pytest.raises(ValueError, match="'train' is already running"):
        timer.start("train")
    with pytest.raises(KeyError, match="'train'"):
        timer.get_elapsed("train")  # running, but never stopped
    timer.stop("train")
    with pytest.raises(ValueError, match="'p99'.*mean, median"):
        timer.reduce("train", "p99")
    with pytest.raises(ValueError, match="p99"):
        timer.get_timing_metrics({"train": "p99"})
    with pytest.raises(KeyError, match="'eval'"):
        timer.reduce("eval")


def test_reset_one_label_or_everything():
    timer = Timer()
    for label in ("a", "b"):
        with timer.time(label):
            pass
    timer.start("c")
    timer.reset("a")
    assert set(timer.get_timing_metrics()) == {"b"}
    timer.stop("c")  # still running after resetting another label
    timer.reset()
    assert timer.get_timing_metrics() == {}
    with pytest.raises(ValueError, match="'c' is not running"):
        timer.stop("c")


def test_timeout_strings():
    assert convert_to_seconds("01:02:03:04") == 86400 + 7200 + 180 + 4
    with pytest.raises(ValueError, match="'3:45' is not DD:HH:MM:SS"):
        convert_to_seconds("3:45")


def test_timeout_checker_says_save_once_at_the_deadline(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    checker = TimeoutChecker(timeout="00:00:01:00")
    now[0] += 59.0
    assert checker.check_save() is False
    now[0] += 1.0
    assert checker.check_save() is True
    assert checker.check_save() is False  # one save, not one per later step
    assert TimeoutChecker(timeout=None).check_save() is False


def test_fit_last_save_time_saves_one_average_iteration_early(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    checker = TimeoutChecker(timeout="00:00:01:40", fit_last_save_time=True)  # 100 s
    late = TimeoutChecker(timeout="00:00:01:40")
    checker.start_iterations()
    for step_seconds in (10.0, 30.0):  # average 20 s
        now[0] += step_seconds
        checker.mark_iteration()
    assert checker.iteration_times == [10.0, 30.0]
    now[0] = 79.0
    assert checker.check_save() is False
    now[0] = 80.0  # 80 s + the 20 s a further iteration takes reaches the limit
    assert checker.check_save() is True
    assert late.check_save() is False


def test_mark_iteration_needs_start_iterations():
    with pytest.raises(RuntimeError, match="start_iterations"):
        TimeoutChecker().mark_iteration()
