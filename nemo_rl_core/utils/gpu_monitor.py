"""GPU use while a run trains (``logger.monitor_gpus``), under NeMo RL's metric names.

NeMo RL reads Ray's Prometheus endpoints; there is no Ray here, so each sample comes from
``nvidia-smi`` (GPUs) and psutil (host memory). As in NeMo RL, samples are buffered every
``collection_interval`` seconds and handed to the logger every ``flush_interval``, as
``ray/node.0.gpu.<i>.util`` (percent), ``ray/node.0.gpu.<i>.mem_gb``,
``ray/node.0.mem_gb`` and ``ray/node.0.mem_total_gb``, with the seconds since the monitor
started as their own x-axis (``ray/ray_step``).
"""

import logging
import subprocess
import threading
import time
from collections.abc import Callable

import psutil

PREFIX = "ray"
STEP_METRIC = f"{PREFIX}/ray_step"
NVIDIA_SMI = [
    "nvidia-smi",
    "--query-gpu=index,utilization.gpu,memory.used",
    "--format=csv,noheader,nounits",
]
GIB = 1024**3


def parse_nvidia_smi(text: str, node: int = 0) -> dict[str, float]:
    """Per-GPU utilization (percent) and memory in use (GiB) from ``NVIDIA_SMI``'s output."""
    metrics: dict[str, float] = {}
    for line in filter(None, (line.strip() for line in text.splitlines())):
        index, utilization, memory_mib = (field.strip() for field in line.split(","))
        metrics[f"node.{node}.gpu.{index}.util"] = float(utilization)
        metrics[f"node.{node}.gpu.{index}.mem_gb"] = float(memory_mib) / 1024
    return metrics


def host_memory(node: int = 0) -> dict[str, float]:
    memory = psutil.virtual_memory()
    return {
        f"node.{node}.mem_gb": (memory.total - memory.available) / GIB,
        f"node.{node}.mem_total_gb": memory.total / GIB,
    }


def sample_node() -> dict[str, float]:
    """This machine's GPUs and host memory now."""
    listing = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, check=True, timeout=30)
    return {**parse_nvidia_smi(listing.stdout), **host_memory()}


class GpuMonitor:
    """A thread that samples every ``collection_interval`` seconds and passes the buffered
    samples to ``log(metrics, step, prefix, step_metric)`` every ``flush_interval``."""

    def __init__(
        self,
        collection_interval: float,
        flush_interval: float,
        log: Callable[..., None],
        sample: Callable[[], dict[str, float]] = sample_node,
    ) -> None:
        self.collection_interval, self.flush_interval = collection_interval, flush_interval
        self._log, self._sample = log, sample
        self._buffer: list[tuple[int, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-monitor", daemon=True)
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and hand over what is buffered."""
        self._stop.set()
        self._thread.join()
        self.flush()

    def _loop(self) -> None:
        last_flush = time.monotonic()
        while not self._stop.is_set():
            try:
                self._buffer.append((int(time.monotonic() - self._started), self._sample()))
            except (
                subprocess.SubprocessError,
                OSError,
            ) as err:  # a missed sample, not a failed run
                logging.getLogger(__name__).warning("GPU monitoring: no sample (%s)", err)
            if time.monotonic() - last_flush >= self.flush_interval:
                self.flush()
                last_flush = time.monotonic()
            self._stop.wait(self.collection_interval)

    def flush(self) -> None:
        buffered, self._buffer = self._buffer, []
        for seconds, metrics in buffered:
            self._log(
                {**metrics, "ray_step": seconds}, seconds, prefix=PREFIX, step_metric=STEP_METRIC
            )
