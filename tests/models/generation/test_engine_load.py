"""The engine-load sampler of ``vllm_cfg.enable_vllm_metrics_logger``, on a fake gauge reader."""

import threading
from types import SimpleNamespace

from nemo_rl_core.models.generation.engine_load import (
    RUNNING,
    WAITING,
    EngineLoad,
    gauge_total,
    sampling,
    timeline,
)


def gauges(running: int, waiting: int) -> list[SimpleNamespace]:
    return [
        SimpleNamespace(name=RUNNING, value=float(running)),
        SimpleNamespace(name=WAITING, value=float(waiting)),
        SimpleNamespace(name="vllm:other", value=9.0),
    ]


def test_gauges_of_every_engine_add_up() -> None:
    snapshot = [*gauges(3, 1), SimpleNamespace(name=RUNNING, value=2.0)]
    assert gauge_total(snapshot, RUNNING) == 5
    assert gauge_total(snapshot, "vllm:absent") is None


def test_samples_are_taken_while_the_block_runs_and_summarised_once() -> None:
    reads = iter([gauges(4, 2), gauges(6, 0)])
    done = threading.Event()

    def read() -> list[SimpleNamespace]:
        snapshot = next(reads, None)
        if snapshot is None:
            done.set()
            return []
        return snapshot

    load = EngineLoad()
    with sampling(read, 0.001, load):
        assert done.wait(5.0)
    assert load.take() == {
        "max_inflight_batch_size": 6,
        "mean_inflight_batch_size": 5.0,
        "max_num_pending_samples": 2,
        "mean_num_pending_samples": 1.0,
        "num_engine_load_samples": 2,
    }
    assert load.take() == {}  # taken: the next stage starts over


def test_timeline_marks_idle_and_busy_stretches() -> None:
    assert timeline([0, 1, 8, 8]) == "▁▃▉▉"
    assert len(timeline(list(range(1, 201)), width=50)) == 50
