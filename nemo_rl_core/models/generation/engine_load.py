"""How busy the vLLM engine was while it generated (``vllm_cfg.enable_vllm_metrics_logger``).

NeMo RL's async vLLM worker samples the engine's Prometheus gauges every
``vllm_metrics_logger_interval`` seconds: requests running (its in-flight batch) and
requests waiting (its pending samples). Here a thread samples the same gauges while one
``generate`` call runs, and the stage reports their maximum and mean under NeMo RL's names.
"""

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# The stage metrics of one generation's samples (EngineLoad.take).
ENGINE_LOAD_METRICS = (
    "max_inflight_batch_size",
    "mean_inflight_batch_size",
    "max_num_pending_samples",
    "mean_num_pending_samples",
    "num_engine_load_samples",
)
_MARKERS = "▃▅▆▉"
_IDLE = "▁"
TIMELINE_WIDTH = 50


@dataclass
class EngineLoad:
    """The samples taken so far: one value of each gauge per interval."""

    inflight_batch_sizes: list[int] = field(default_factory=list)
    num_pending_samples: list[int] = field(default_factory=list)

    def take(self) -> dict[str, float]:
        """The samples' summary as stage metrics (none if no sample was taken); starts over."""
        inflight, pending = self.inflight_batch_sizes, self.num_pending_samples
        self.inflight_batch_sizes, self.num_pending_samples = [], []
        if not inflight:
            return {}
        values = (
            max(inflight),
            sum(inflight) / len(inflight),
            max(pending, default=0),
            sum(pending) / len(pending) if pending else 0.0,
            len(inflight),
        )
        return dict(zip(ENGINE_LOAD_METRICS, values, strict=True))


def gauge_total(snapshot: list[Any], name: str) -> int | None:
    """The value of gauge ``name`` summed over its label sets (engines), None if absent."""
    values = [m.value for m in snapshot if m.name == name and hasattr(m, "value")]
    return int(sum(values)) if values else None


@contextmanager
def sampling(
    read_metrics: Callable[[], list[Any]], interval_s: float, into: EngineLoad
) -> Iterator[None]:
    """Sample the running and waiting request counts every ``interval_s`` seconds into
    ``into`` while the block runs (the engine generates in this thread meanwhile)."""
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(interval_s):
            snapshot = read_metrics()
            running, waiting = gauge_total(snapshot, RUNNING), gauge_total(snapshot, WAITING)
            if running is not None:
                into.inflight_batch_sizes.append(running)
                into.num_pending_samples.append(waiting or 0)

    thread = threading.Thread(target=sample, name="vllm-engine-load", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    if into.inflight_batch_sizes:
        logger.info("vLLM in-flight batch size: %s", timeline(into.inflight_batch_sizes))


def timeline(values: list[int], width: int = TIMELINE_WIDTH) -> str:
    """NeMo RL's per-worker timeline: one marker per stretch of samples, taller for busier,
    ``▁`` where the engine ran no request."""
    if not values:
        return ""
    step = max(1, -(-len(values) // width))
    stretches = [max(values[i : i + step]) for i in range(0, len(values), step)]
    top = max(stretches)
    bin_width = (top + 1) / len(_MARKERS)
    return "".join(
        _IDLE if v == 0 else _MARKERS[min(int(v // bin_width), len(_MARKERS) - 1)]
        for v in stretches
    )
