"""A process that imports the flows ends with its heap frozen: the exit handlers registered
around it still run, and the final collections skip what was frozen."""

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_process_importing_the_flows_freezes_its_heap_at_exit_and_its_handlers_run(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "finalized.txt"
    script = textwrap.dedent(
        f"""
        import atexit, gc, weakref
        # registered before the flows' handler, so it runs after it (last in, first out)
        atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
        import flows
        print("frozen before exit:", gc.get_freeze_count() > 0)

        class Held:
            pass

        held = Held()
        weakref.finalize(held, lambda: open({str(marker)!r}, "w").write("ran"))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.split("\n")[:2] == ["frozen before exit: False", "frozen at exit: True"]
    assert marker.read_text() == "ran", "a finalizer of an object alive at exit still ran"
