"""Megatron in one process sets up its one-rank group without touching the environment."""

import os
import subprocess
import sys

ONE_RANK_TWICE = """
import os
import torch.distributed as dist
from megatron.core import parallel_state
from nemo_rl_core.models.megatron.model import init_parallel_state

init_parallel_state(1, 0)
parallel_state.destroy_model_parallel()
dist.destroy_process_group()
init_parallel_state(1, 0)  # a second model after the first one's group was ended
print(sorted(key for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if key in os.environ))
"""


def test_one_rank_twice_leaves_no_rendezvous_variables_for_children() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_PORT")}
    result = subprocess.run(
        [sys.executable, "-c", ONE_RANK_TWICE], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
