"""CodeEnvironment: correct solutions pass; every escape attempt fails its sample only."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_rl_core.environments.code_environment import extract_code
from nemo_rl_core.environments.code_sandbox import (
    _UID_BLOCK,
    _UID_BLOCKS,
    _UID_FIRST,
    SandboxLimits,
    _enter_network_namespace,
    network_namespace_available,
    run_sandboxed,
)
from nemo_rl_core.environments.utils import create_env

REVERSE_TESTS = [{"input": "abc\n", "output": "cba"}, {"input": "hello\n", "output": "olleh"}]


def _answer(code: str) -> list[dict]:
    return [
        {"role": "user", "content": "Write the program."},
        {"role": "assistant", "content": f"Here it is:\n```python\n{code}\n```\n"},
    ]


def _sandbox_processes() -> list[int]:
    """Processes owned by sandbox uids right now."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if _UID_FIRST <= entry.stat().st_uid < _UID_FIRST + _UID_BLOCKS * _UID_BLOCK:
                    pids.append(int(entry.name))
            except FileNotFoundError:
                pass
    return pids


@pytest.fixture(scope="module")
def env():
    environment = create_env(
        "code",
        {
            "num_workers": 2,
            "wall_time_limit_s": 4,
            "cpu_time_limit_s": 2,
            "memory_limit_mb": 256,
            "output_limit_bytes": 4096,
        },
    )
    yield environment
    environment.shutdown()


def _step(env, code: str, tests=None):
    result = env.step([_answer(code)], [{"tests": tests or REVERSE_TESTS}])
    return result.rewards.item(), result.metadata[0]


def test_correct_solutions_pass(env):
    reward, meta = _step(env, "print(input()[::-1])")
    assert reward == 1.0 and meta["tests_passed"] == 2
    asserts = [{"assert": "assert add(2, 3) == 5"}, {"assert": "assert add(-1, 1) == 0"}]
    assert _step(env, "def add(a, b):\n    return a + b", asserts)[0] == 1.0
    stdlib = "import json, re, collections, itertools, math\nprint(json.dumps(sorted('cba'))[2])"
    assert _step(env, stdlib, [{"input": "", "output": "a"}])[0] == 1.0


def test_wrong_or_missing_code_fails(env):
    reward, meta = _step(env, "print(input())")
    assert reward == 0.0 and meta["tests_passed"] == 0 and "wrong output" in meta["reward_reason"]
    result = env.step(
        [[{"role": "assistant", "content": "no code here"}]], [{"tests": REVERSE_TESTS}]
    )
    assert result.rewards.item() == 0.0
    assert "no fenced code block" in result.metadata[0]["reward_reason"]


def test_reading_files_outside_the_sandbox_fails(env, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-VALUE")
    for code in (
        f"print(open({str(secret)!r}).read())",
        "print(open('/etc/passwd').read())",
        f"import os\nos.symlink({str(secret)!r}, 'link')\nprint(open('link').read())",
        "import os\nprint(os.listdir('/'))",
    ):
        reward, meta = _step(env, code, [{"input": "", "output": "TOP-SECRET-VALUE"}])
        assert reward == 0.0, code
        assert "TOP-SECRET-VALUE" not in meta["reward_reason"]
        assert "outside the sandbox" in meta["reward_reason"], meta["reward_reason"]


def test_writing_or_deleting_outside_the_sandbox_fails_and_host_is_untouched(env, tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("keep me")
    target = tmp_path / "pwned.txt"
    for code in (
        f"open({str(target)!r}, 'w').write('x')\nprint('done')",
        f"import os\nos.remove({str(keep)!r})\nprint('done')",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})\nprint('done')",
    ):
        assert _step(env, code, [{"input": "", "output": "done"}])[0] == 0.0, code
    assert keep.read_text() == "keep me"
    assert not target.exists()


def test_network_access_fails_and_reaches_nothing(env):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        code = (
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "s.sendall(b'hi')\nprint('connected')"
        )
        reward, meta = _step(env, code, [{"input": "", "output": "connected"}])
        assert reward == 0.0 and "socket" in meta["reward_reason"]
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


def test_fork_bombs_fail_and_leave_no_processes(env):
    before = _sandbox_processes()
    for code in (
        "import os\nwhile True:\n    os.fork()",
        "import multiprocessing as mp\nps = [mp.Process(target=print) for _ in range(500)]\n"
        "[p.start() for p in ps]\nprint('done')",
        "import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])\nprint('done')",
        "import os\nos.system('sleep 100 &')\nprint('done')",
    ):
        assert _step(env, code, [{"input": "", "output": "done"}])[0] == 0.0, code
    assert _sandbox_processes() == before == []


def test_huge_output_hang_and_memory_fail(env):
    start = time.monotonic()
    reward, meta = _step(env, "while True:\n    print('x' * 1000)", [{"input": "", "output": ""}])
    assert reward == 0.0 and "output limit of 4096 bytes" in meta["reward_reason"]
    reward, meta = _step(env, "import time\ntime.sleep(60)", [{"input": "", "output": ""}])
    assert reward == 0.0 and "wall time limit" in meta["reward_reason"]
    reward, meta = _step(
        env, "x = bytearray(1 << 30)\nprint(len(x))", [{"input": "", "output": ""}]
    )
    assert reward == 0.0 and "MemoryError" in meta["reward_reason"]
    assert time.monotonic() - start < 30


def test_cpu_time_limit_kills_a_busy_loop():
    limits = SandboxLimits(wall_time_s=60, cpu_time_s=1)
    start = time.monotonic()
    result = run_sandboxed("while True:\n    pass", "", limits)
    assert not result.ok and "CPU" in result.reason
    assert time.monotonic() - start < 30


@pytest.mark.skipif(os.geteuid() != 0, reason="uid drop and process limit apply when run as root")
def test_program_runs_unprivileged_with_limits():
    code = "import os, resource\nprint(os.getuid(), resource.getrlimit(resource.RLIMIT_NPROC)[0])"
    result = run_sandboxed(code, "", SandboxLimits(max_processes=7))
    uid, nproc = map(int, result.stdout.split())
    assert result.ok and uid != 0 and nproc == 7


def test_a_batch_with_attacks_still_scores_the_good_samples(env):
    codes = ["print(input()[::-1])", "import os\nwhile True: os.fork()", "print(input()[::-1])"]
    result = env.step([_answer(c) for c in codes], [{"tests": REVERSE_TESTS}] * 3)
    assert result.rewards.tolist() == [1.0, 0.0, 1.0]


def test_extract_code_takes_the_last_block():
    text = "```python\nprint(1)\n```\nbetter:\n```\nprint(2)\n```"
    assert extract_code(text).strip() == "print(2)"
    assert extract_code("```python\nprint(3)").strip() == "print(3)"
    assert extract_code("none") is None


def test_bad_tests_metadata_names_the_sample(env):
    with pytest.raises(KeyError, match="sample 0"):
        env.step([_answer("print(1)")], [{"tests": [{"input": "x"}]}])


@pytest.mark.skipif(not network_namespace_available(), reason="host cannot unshare a netns")
def test_network_namespace_alone_reaches_nothing():
    """The OS layer under the audit hook: a plain child in the namespace cannot connect."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    code = f"import socket; socket.create_connection(('127.0.0.1', {server.getsockname()[1]}), 2)"
    try:
        child = subprocess.run(
            [sys.executable, "-I", "-S", "-c", code],
            preexec_fn=_enter_network_namespace,
            capture_output=True,
            text=True,
        )
        assert child.returncode != 0 and "Error" in child.stderr
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()
