"""torchrun for one node, reporting how its ranks ended in a JSON file.

``python -m nemo_rl_core.distributed.node_agent SUMMARY.json <torchrun arguments>`` calls
torch's own launcher (``torch.distributed.run.run``, what the ``torchrun`` command runs:
elastic agent, c10d rendezvous, worker processes) and writes what its exception holds
(which global rank failed, its exit code or signal, the traceback torchrun's ``@record``
error file carries), which torchrun itself only prints as a table. It ends, stopping its
ranks, when the worker that launched it dies (``launcher_death``).
"""

import json
import sys
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousError
from torch.distributed.run import parse_args, run

from nemo_rl_core.distributed.launcher_death import end_with_launcher
from nemo_rl_core.utils.process_exit import skip_final_collections

SUMMARY_TRACEBACK_LINES = 12


def _message(failure: Any) -> str:
    """The failure's message, with the end of its traceback when the error file has one."""
    message = failure.message
    if isinstance(message, dict):
        text = str(message.get("message", ""))
        stack = str(message.get("extraInfo", {}).get("py_callstack", "")).strip().splitlines()
        return "\n".join([text, *stack[-SUMMARY_TRACEBACK_LINES:]]).strip()
    return str(message)


def main(argv: list[str]) -> int:
    end_with_launcher()
    skip_final_collections()
    summary_path, torchrun_args = Path(argv[0]), argv[1:]
    summary: dict[str, Any]
    try:
        run(parse_args(torchrun_args))
        summary = {"ok": True}
    except ChildFailedError as err:
        summary = {
            "failures": [
                {
                    "rank": rank,
                    "local_rank": failure.local_rank,
                    "exitcode": failure.exitcode,
                    "message": _message(failure),
                }
                for rank, failure in sorted(err.failures.items())
            ]
        }
    except RendezvousError as err:  # the other nodes did not come (join_timeout), or left
        summary = {"rendezvous": f"{type(err).__name__}: {err}"}
    summary_path.write_text(json.dumps(summary))
    return 0 if summary.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
