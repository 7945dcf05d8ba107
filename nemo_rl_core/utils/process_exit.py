"""Quick process exits. A process that loaded torch, transformers and Prefect spent 1.5-2 s
of CPU after its last line here, in the interpreter's final garbage collections over every
object those libraries made (a bare ``import torch`` alone: ~0.6 s). Every rank of a rank
group, torchrun agent, stage worker and flow process paid it when it ended, on the cores
the stages compute on, and a stopped rank group's nodes ended that much later
(bench/RESULTS.md, issue 30).

Freezing the heap at exit (``gc.freeze``) leaves those objects out of the final collections;
the interpreter still clears its modules, so objects no cycle holds are released as before,
and every exit handler (Prefect's log flush, ``weakref.finalize``, multiprocessing's) still
runs. What is skipped is the collection of objects held only by reference cycles, whose
finalizers Python never promises to run at exit."""

import atexit
import gc
from functools import cache


@cache
def skip_final_collections() -> None:
    """Freeze the heap as this process exits (an exit handler, registered once per
    process; the handlers around it run either way)."""
    atexit.register(gc.freeze)
