"""Fresh processes for the tests of what a command line imports before it refuses (the
config check refuses before torch loads): each command runs as ``python -c CODE ARGS``
would, in a child forked from one process that has imported light modules only, instead of
a new interpreter per command (its start and those imports: a second of CPU each, for some
30 commands of ``make test-fast``).

A child is its command's own process: its working directory, environment, arguments,
output and exit status are its own, and the heavy packages it reports are those imported by
its end (none were before: the parent checks its preload). Packages named ``hidden`` are
absent for the command, as Python's import system takes a None in ``sys.modules``
(``find_spec`` answers None)."""

import itertools
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HEAVY = ("torch", "transformers", "vllm", "prefect")
TIMEOUT_S = 300.0

# Reads one command per line (JSON) and answers each with its child's exit status.
FORK_SERVER = f"""
import json, os, sys, traceback

HEAVY = {HEAVY!r}
for module in sys.argv[1:]:
    __import__(module)
preloaded = [m for m in HEAVY if m in sys.modules]
assert not preloaded, f"importing {{sys.argv[1:]}} imported {{preloaded}}"
while line := sys.stdin.readline():
    command = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(command["cwd"])
        os.environ.clear()
        os.environ.update(command["env"])
        for fd, path in enumerate((command["stdout"], command["stderr"]), start=1):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.modules.update(dict.fromkeys(command["hidden"]))
        sys.argv = ["-c", *command["args"]]
        status = 0
        try:
            exec(compile(command["code"], "<string>", "exec"), {{"__name__": "__main__"}})
        except SystemExit as exit:  # as the interpreter ends on it
            status = 0 if exit.code is None else exit.code
            if not isinstance(status, int):
                print(status, file=sys.stderr)
                status = 1
        except BaseException:
            traceback.print_exc()
            status = 1
        with open(command["heavy"], "w") as heavy:
            json.dump([m for m in HEAVY if m in sys.modules], heavy)
        sys.exit(status)  # ended as an interpreter ends: its exit handlers run
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


@dataclass(frozen=True)
class Finished:
    """A command's exit status, output, and the packages of ``HEAVY`` it imported."""

    returncode: int
    stdout: str
    stderr: str
    heavy: list[str]


class PythonForks:
    """The forking process, with ``preload`` imported and ``pythonpath`` on its path."""

    def __init__(self, folder: Path, preload: Sequence[str], pythonpath: Path) -> None:
        self.folder, self.numbers = folder, itertools.count()
        self.log = folder / "server.err"
        with self.log.open("w") as log:
            self.server = subprocess.Popen(
                [sys.executable, "-c", FORK_SERVER, *preload],
                env={**os.environ, "PYTHONPATH": str(pythonpath)},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,  # its children with it, should a command hang
            )

    def run(
        self,
        code: str,
        args: Sequence[str] = (),
        cwd: Path | None = None,
        hidden: Sequence[str] = (),
    ) -> Finished:
        """``python -c code *args`` in ``cwd``, with this process's environment as it is now
        (a subprocess's, as ``subprocess.run`` starts one)."""
        assert self.server.stdin is not None and self.server.stdout is not None
        streams = self.folder / str(next(self.numbers))
        command = {
            "code": code,
            "args": list(args),
            "cwd": str(cwd or Path.cwd()),
            "env": dict(os.environ),
            "hidden": list(hidden),
            **{name: f"{streams}.{name}" for name in ("stdout", "stderr", "heavy")},
        }
        try:
            self.server.stdin.write(json.dumps(command) + "\n")
            self.server.stdin.flush()
        except BrokenPipeError:
            answer = ""
        else:
            if not select.select([self.server.stdout], [], [], TIMEOUT_S)[0]:
                os.killpg(self.server.pid, signal.SIGKILL)
                raise TimeoutError(f"python -c ... {' '.join(args)} ran past {TIMEOUT_S:g} s")
            answer = self.server.stdout.readline()
        if not answer:
            raise RuntimeError(f"the forking process ended: {self.log.read_text()[-3000:]}")
        return Finished(
            int(answer),
            Path(command["stdout"]).read_text(),
            Path(command["stderr"]).read_text(),
            json.loads(Path(command["heavy"]).read_text()),
        )

    def close(self) -> None:
        if self.server.stdin is not None:
            self.server.stdin.close()
        self.server.wait(timeout=60)
