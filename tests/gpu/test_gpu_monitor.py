"""``logger.monitor_gpus`` on a machine with GPUs: nvidia-smi's reading under NeMo RL's
names, skipped where there is none. Run where a GPU is lent: ``pytest -m gpu tests/gpu``."""

import shutil

import pytest

from nemo_rl_core.utils.gpu_monitor import sample_node

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi"),
]


def test_sample_reads_every_gpu_and_the_host():
    sample = sample_node()
    assert 0 <= sample["node.0.gpu.0.util"] <= 100
    assert sample["node.0.gpu.0.mem_gb"] >= 0
    assert 0 < sample["node.0.mem_gb"] < sample["node.0.mem_total_gb"]
