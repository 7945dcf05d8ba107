"""How many CPU cores this process may run on, and the OpenMP threads each rank gets.

``os.cpu_count()`` counts the host's cores. A stage worker pinned to a few of them (a
Kubernetes pod with the static CPU manager, ``taskset``, a Slurm job's cpuset) would then
give each of its ranks the host's share: 64 OpenMP threads per rank on a 4-core cpuset
spin against each other on those 4 cores. The cores a process may run on are its affinity
mask, which its children inherit.
"""

import os


def usable_cpu_cores() -> int:
    """The cores this process may run on (its affinity mask; all of them where the
    platform has none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def omp_threads_per_rank(ranks: int) -> str:
    """``OMP_NUM_THREADS`` for each of ``ranks`` processes sharing this process's cores:
    the value set in the environment, else an even share of the usable cores (at least 1)."""
    return os.environ.get("OMP_NUM_THREADS", str(max(1, usable_cpu_cores() // ranks)))
