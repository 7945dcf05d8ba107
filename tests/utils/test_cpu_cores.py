"""``nemo_rl_core.utils.cpu_cores``: the cores a process may run on are its affinity mask, not
the host's count, and each rank's OpenMP threads are its share of those. Each case runs in a
child process pinned to a cpuset (this test process keeps its own)."""

import json
import os
import subprocess
import sys

import pytest

from nemo_rl_core.utils.cpu_cores import usable_cpu_cores

CORES = sorted(os.sched_getaffinity(0))


def pinned(cores: list[int], code: str, env: dict[str, str] | None = None) -> object:
    """The value ``code`` leaves in ``found``, run in a child pinned to ``cores``."""
    script = f"import os, json\nos.sched_setaffinity(0, {set(cores)!r})\n{code}\n"
    script += "print(json.dumps(found))"
    child_env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"} | (env or {})
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=child_env, check=True
    )
    return json.loads(result.stdout.splitlines()[-1])


def test_this_process_may_use_its_affinity_mask() -> None:
    assert usable_cpu_cores() == len(CORES)


def test_a_process_pinned_to_one_core_counts_one_and_gives_each_rank_one_thread() -> None:
    found = pinned(
        CORES[:1],
        "from nemo_rl_core.utils.cpu_cores import omp_threads_per_rank, usable_cpu_cores\n"
        "from nemo_rl_core.utils.key_support import Machine\n"
        "found = [usable_cpu_cores(), omp_threads_per_rank(1), omp_threads_per_rank(2), "
        "Machine(cuda_devices=0).cpu_cores]",
    )
    assert found == [1, "1", "1", 1]


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores")
def test_ranks_share_the_cores_evenly_and_a_set_omp_num_threads_wins() -> None:
    two = CORES[:2]
    code = "from nemo_rl_core.utils.cpu_cores import omp_threads_per_rank\n" + (
        "found = [omp_threads_per_rank(1), omp_threads_per_rank(2), omp_threads_per_rank(3)]"
    )
    assert pinned(two, code) == ["2", "1", "1"]
    assert pinned(two, code, env={"OMP_NUM_THREADS": "7"}) == ["7", "7", "7"]


@pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores")
def test_a_node_on_one_core_refuses_two_cpu_ranks_naming_the_cores_it_may_use() -> None:
    refusal = pinned(
        CORES[:1],
        "from nemo_rl_core.distributed.node_launch import Rendezvous, RanksFailed, _check_fits\n"
        "try:\n"
        "    _check_fits(0, Rendezvous('attempt-1', nnodes=1, nproc_per_node=2))\n"
        "except RanksFailed as error:\n"
        "    found = str(error)",
    )
    assert "need 2 cores (no CUDA), this machine has 1" in str(refusal)
