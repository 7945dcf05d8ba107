"""Run several benchmarks' ``--smoke`` mode in one Python process, one after another, each
as ``python bench/<script> --smoke [ARGS]`` would (``__main__``, its own argv): the process
pays the imports (torch, transformers, Prefect: ~6 CPU-s here) once instead of once per
script.

    python tests/bench/smoke_runner.py storage.py train.py "learning_smollm2.py --seeds 2" ...

Each script's output follows a line ``SMOKE_BEGIN <script>`` and ends with a line
``SMOKE_END <script> <status> <seconds>``: ``ok``, or the exception's name (its traceback is
printed before the line), and the script's wall seconds (what each smoke costs the suite).
A failing script does not stop the next one; the exit status is 1 when any failed."""

import os
import runpy
import shlex
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_script(script: str, args: list[str]) -> str:
    """``bench/<script> --smoke ARGS`` run here; ``ok`` or the name of what it raised. The
    next script starts with this one's torch threads and environment undone (storage.py
    sets one thread)."""
    import torch

    threads, environment = torch.get_num_threads(), dict(os.environ)
    sys.argv = [f"bench/{script}", "--smoke", *args]
    try:
        runpy.run_path(str(REPO / "bench" / script), run_name="__main__")
    except SystemExit as stop:
        return "ok" if stop.code in (None, 0) else f"SystemExit({stop.code})"
    except BaseException as error:  # noqa: BLE001 - reported, the next script still runs
        traceback.print_exc(file=sys.stdout)
        return type(error).__name__
    finally:
        torch.set_num_threads(threads)
        os.environ.clear()
        os.environ.update(environment)
    return "ok"


def main(commands: list[str]) -> int:
    """Each command is a script and its arguments after ``--smoke``, as one string."""
    sys.path[:0] = [str(REPO / "bench"), str(REPO)]  # as for ``python bench/<script>``
    import flows  # noqa: F401  (first, as each script has it: its process settings precede torch)

    failed = False
    for command in commands:
        script, *args = shlex.split(command)
        print(f"SMOKE_BEGIN {script}", flush=True)
        start = time.perf_counter()
        status = run_script(script, args)
        print(f"\nSMOKE_END {script} {status} {time.perf_counter() - start:.1f}", flush=True)
        failed |= status != "ok"
    return int(failed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
