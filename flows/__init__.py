"""Prefect flows of the training algorithms.

Settings that are read once, when a library first loads, are set here, before any flow
module imports prefect or torch. Values already in the environment win.
"""

import os

from nemo_rl_core.utils.process_exit import skip_final_collections

# Every process that imports the flows (a flow, a stage worker, a rank of a rank group) ends
# without the interpreter's final collections over torch's and Prefect's objects (1.5-2 s).
skip_final_collections()

# The ephemeral API server gets 20 s by default; a loaded 2-core machine needs more.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
# OpenMP threads that finish a parallel region spin (libgomp's default) instead of sleeping.
# Next to Prefect's API server, the reward workers or anyone else's process, the thread a
# region waits for has often lost its core, and every small op pays for it: on 2 shared
# cores the tiny model's iteration ran 8-16x slower (bench/RESULTS.md, issue 8). libgomp
# reads this only when torch first loads it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The ephemeral server's telemetry reaches for the network (there is none here) and, beside
# the runs' own writes, hits "database is locked" on its SQLite file: a traceback per run.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The library's own loggers (a storage outage's retries, the stage log) reach the run's
# Prefect log, not only the process's stderr.
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "nemo_rl_core")
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
