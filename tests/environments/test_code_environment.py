"""CodeEnvironment: correct solutions pass; limits hold; the environment refuses to start
without a real sandbox."""

import os
import resource
import socket
import time
from pathlib import Path

import psutil
import pytest
from sandbox_attacks import answer

from nemo_rl_core.environments.code_environment import CodeEnvironment, extract_code
from nemo_rl_core.environments.code_sandbox import (
    SandboxLimits,
    SandboxUnavailableError,
    probe_boundary,
    require_sandbox,
    run_sandboxed,
)
from nemo_rl_core.environments.sandbox_uids import SANDBOX_UIDS, live_processes

REVERSE_TESTS = [{"input": "abc\n", "output": "cba"}, {"input": "hello\n", "output": "olleh"}]
ADD_TESTS = [{"assert": "assert add(2, 3) == 5"}, {"assert": "assert add(-1, 1) == 0"}]


JUDGE = b"\0code_judge\0"  # how a judge's command line ends


def sandbox_processes() -> list[int]:
    """Live processes of samples' sandboxes right now (the environment's judges live on)."""
    if os.geteuid() != 0:
        return []
    pids = [pid for uid in SANDBOX_UIDS for pid in live_processes(uid) if ours_or_orphaned(pid)]
    return [pid for pid in pids if (cmd := cmdline(pid)) is not None and not cmd.endswith(JUDGE)]


def ours_or_orphaned(pid: int) -> bool:
    """Whether a sandbox process descends from this test process, or escaped to the host's
    init: another pytest worker's sandboxes (same uid pool) are neither."""
    try:
        parents = psutil.Process(pid).parents()
    except psutil.NoSuchProcess:
        return False
    escaped = not parents or parents[0].pid == 1
    return escaped or any(parent.pid == os.getpid() for parent in parents)


def cmdline(pid: int) -> bytes | None:
    """None where the process ended since it was listed (the machine is shared: its pids
    come and go between the listing and the read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None


def step(env, code: str, tests=None):
    result = env.step([answer(code)], [{"tests": tests or REVERSE_TESTS}])
    return result.rewards.item(), result.metadata[0]


def test_correct_solutions_pass(code_env):
    reward, meta = step(code_env, "print(input()[::-1])")
    assert reward == 1.0 and meta["tests_passed"] == 2
    assert step(code_env, "def add(a, b):\n    return a + b", ADD_TESTS)[0] == 1.0
    stdlib = "import json, re, collections, itertools, math\nprint(json.dumps(sorted('cba'))[2])"
    assert step(code_env, stdlib, [{"input": "", "output": "a"}])[0] == 1.0
    unicode = "print('héllo ✓')"
    assert step(code_env, unicode, [{"input": "", "output": "héllo ✓"}])[0] == 1.0


def test_assert_tests_compare_typed_values_in_the_parent(code_env):
    tests = [
        {"assert": "assert pair(1) == (1, 2)"},
        {"assert": "import math\nassert math.isclose(half(1), 0.5, rel_tol=1e-9)"},
        {"assert": "assert sorted(keys({'b': 1, 'a': 2})) == ['a', 'b']"},
    ]
    good = "def pair(x): return (x, x + 1)\ndef half(x): return x / 2\ndef keys(d): return list(d)"
    assert step(code_env, good, tests)[0] == 1.0
    # a list is not the tuple the assert expects, exactly as in plain Python
    reward, meta = step(code_env, good.replace("(x, x + 1)", "[x, x + 1]"), tests)
    assert reward == 0.0 and meta["tests_passed"] == 2
    assert "test 0: assertion failed: pair(1) == (1, 2)" in meta["reward_reason"]


def test_the_judge_evaluates_asserts_and_calls_the_solution_for_its_values(code_env):
    """Comparisons inside comprehensions, methods of the solution's classes, generators over
    its calls: each runs in the judge, which asks the sample's sandbox for one call at a time."""
    code = (
        "class Solution:\n    def two_sum(self, nums, target):\n        seen = {}\n"
        "        for i, n in enumerate(nums):\n            if target - n in seen:\n"
        "                return [seen[target - n], i]\n            seen[n] = i\n"
        "def is_even(n):\n    return n % 2 == 0\n"
        "def rev(s):\n    return s[::-1]\n"
        "def largest(xs):\n    return max(xs)\n"
        "if __name__ == '__main__':\n    print(rev(input()))\n"
    )
    tests = [
        {"input": "abc\n", "output": "cba"},
        {"assert": "assert Solution().two_sum([2, 7, 11], 9) == [0, 1]"},
        {"assert": "assert all(is_even(n) == (n % 2 == 0) for n in range(6))"},
        {"assert": "assert sum(is_even(n) for n in range(6)) == 3 and rev('ab') == 'ba'"},
        # arguments far past the 4096-byte output limit, which bounds only what comes back
        {"assert": "assert largest(list(range(5000))) == 4999"},
    ]
    assert step(code_env, code, tests) == (
        1.0,
        {"tests": tests, "tests_passed": 5, "reward_reason": "all tests passed"},
    )
    opaque = "def f():\n    return object()"
    reward, meta = step(code_env, opaque, [{"assert": "assert f() == 1"}])
    assert reward == 0.0
    assert (
        "test 0: f() == 1 raised TypeError: the solution's value is not plain"
        in meta["reward_reason"]
    )


def test_an_assert_test_past_its_wall_time_fails_and_the_rest_are_not_judged(code_env):
    code = "import time\ndef slow():\n    time.sleep(60)\ndef add(a, b):\n    return a + b"
    tests = [
        {"assert": "assert add(1, 1) == 2"},
        {"assert": "assert slow() is None"},
        {"assert": "assert add(2, 2) == 4"},
    ]
    start = time.monotonic()
    reward, meta = step(code_env, code, tests)
    assert reward == 0.0 and meta["tests_passed"] == 1
    assert meta["reward_reason"] == (
        "test 1: wall time limit of 4s exceeded; "
        "test 2: not judged: the program was still busy with test 1"
    )
    assert time.monotonic() - start < 20


def test_a_judge_that_died_is_replaced_for_the_next_sample(code_env):
    add = "def add(a, b):\n    return a + b"
    assert step(code_env, add, ADD_TESTS)[0] == 1.0
    judges = [  # this process's own judges only (a child that just ended has no cmdline)
        child
        for child in psutil.Process().children(recursive=True)
        if (command := cmdline(child.pid)) is not None and command.endswith(JUDGE)
    ]
    assert judges
    for judge in judges:
        judge.kill()
    assert step(code_env, add, ADD_TESTS) == (
        1.0,
        {"tests": ADD_TESTS, "tests_passed": 2, "reward_reason": "all tests passed"},
    )


def test_wrong_or_missing_code_fails(code_env):
    reward, meta = step(code_env, "print(input())")
    assert reward == 0.0 and meta["tests_passed"] == 0 and "wrong output" in meta["reward_reason"]
    result = code_env.step(
        [[{"role": "assistant", "content": "no code here"}]], [{"tests": REVERSE_TESTS}]
    )
    assert result.rewards.item() == 0.0
    assert "no fenced code block" in result.metadata[0]["reward_reason"]
    reward, meta = step(code_env, "def add(a, b):\n    return a * b + 1", ADD_TESTS)
    assert reward == 0.0 and meta["tests_passed"] == 1


def test_host_files_are_out_of_reach(code_env, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-VALUE")
    keep = tmp_path / "keep.txt"
    keep.write_text("keep me")
    for code in (
        f"print(open({str(secret)!r}).read())",
        "print(open('/etc/passwd').read())",
        f"import os\nos.symlink({str(secret)!r}, 'link')\nprint(open('link').read())",
        f"open({str(tmp_path / 'pwned.txt')!r}, 'w').write('x')\nprint('TOP-SECRET-VALUE')",
        f"import os\nos.remove({str(keep)!r})\nprint('TOP-SECRET-VALUE')",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})\nprint('TOP-SECRET-VALUE')",
    ):
        reward, meta = step(code_env, code, [{"input": "", "output": "TOP-SECRET-VALUE"}])
        assert reward == 0.0, code
        assert "TOP-SECRET-VALUE" not in meta["reward_reason"]
        assert "FileNotFoundError" in meta["reward_reason"], meta["reward_reason"]
    assert keep.read_text() == "keep me" and not (tmp_path / "pwned.txt").exists()


def test_the_sandbox_sees_only_the_interpreter_and_its_box():
    code = "import os\nprint(sorted(os.listdir('/')), os.listdir('/box'), os.getcwd())"
    result = run_sandboxed(code)
    assert result.ok, result
    assert result.stdout.split("]")[0] + "]" == str(
        sorted(["box", "dev", "lib", "lib64", "proc", "usr"])
    )
    assert result.stdout.strip().endswith("[] /box")


def test_network_access_fails_and_reaches_nothing(code_env):
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
        reward, meta = step(code_env, code, [{"input": "", "output": "connected"}])
        assert reward == 0.0 and "socket" in meta["reward_reason"]
        with pytest.raises(TimeoutError):
            server.accept()
    finally:
        server.close()


def test_fork_bombs_fail_and_leave_no_processes(code_env):
    before = sandbox_processes()
    for code in (
        "import os\nwhile True:\n    os.fork()",
        "import multiprocessing as mp\nps = [mp.Process(target=print) for _ in range(500)]\n"
        "[p.start() for p in ps]\nprint('done')",
        "import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])\nprint('done')",
        "import os\nos.system('sleep 100 &')\nprint('done')",
        "import threading, time\n"
        "ts = [threading.Thread(target=time.sleep, args=(1,)) for _ in range(100)]\n"
        "[t.start() for t in ts]\nprint('done')",
    ):
        assert step(code_env, code, [{"input": "", "output": "done"}])[0] == 0.0, code
    assert sandbox_processes() == before == []


def test_huge_output_hang_and_memory_fail(code_env):
    start = time.monotonic()
    reward, meta = step(
        code_env, "while True:\n    print('x' * 1000)", [{"input": "", "output": ""}]
    )
    assert reward == 0.0 and "output limit of 4096 bytes" in meta["reward_reason"]
    reward, meta = step(code_env, "import time\ntime.sleep(60)", [{"input": "", "output": ""}])
    assert reward == 0.0 and "wall time limit" in meta["reward_reason"]
    reward, meta = step(
        code_env, "x = bytearray(1 << 30)\nprint(len(x))", [{"input": "", "output": ""}]
    )
    assert reward == 0.0 and "MemoryError" in meta["reward_reason"]
    write = "with open('big', 'wb') as f:\n    f.write(b'x' * 8192)\nprint(1)"
    reward, meta = step(code_env, write, [{"input": "", "output": "1"}])
    assert reward == 0.0 and "File too large" in meta["reward_reason"]
    assert time.monotonic() - start < 30


def test_cpu_time_limit_kills_a_busy_loop():
    limits = SandboxLimits(wall_time_s=60, cpu_time_s=1)
    start = time.monotonic()
    result = run_sandboxed("while True:\n    pass", "", limits)
    assert not result.ok and "CPU" in result.reason
    assert time.monotonic() - start < 30


def test_program_runs_unprivileged_with_limits():
    code = (
        "import os, resource\n"
        "print(os.getuid(), resource.getrlimit(resource.RLIMIT_NPROC)[0], "
        "resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print(status['CapEff'].strip(), status['NoNewPrivs'].strip(), status['Seccomp'].strip())"
    )
    result = run_sandboxed(code, "", SandboxLimits(max_processes=7, memory_mb=300))
    assert result.ok, result
    ids, security = result.stdout.splitlines()
    assert ids.split() == ["1000", "7", "300"]
    # no capabilities, no-new-privs set (setuid binaries gain nothing), seccomp filtering
    assert security.split() == ["0000000000000000", "1", "2"]


def test_a_sample_runs_all_its_tests_in_one_sandbox(code_env):
    """Issue 33: one sandbox per sample, not one per test. Its programs (one per stdout test)
    share the sample's box, and its assert tests are judged against one run of its code,
    as the asserts of a test file run after one import of the module."""
    appender = (
        "import os\nwith open('/box/runs', 'a') as log:\n    log.write('x')\n"
        "print(os.path.getsize('/box/runs'))"
    )
    reward, meta = step(code_env, appender, [{"input": "", "output": str(n)} for n in (1, 2, 3)])
    assert reward == 1.0, meta
    counter = "calls = []\ndef count():\n    calls.append(1)\n    return len(calls)"
    tests = [{"assert": "assert count() == 1"}, {"assert": "assert count() == 2"}]
    reward, meta = step(code_env, counter, tests)
    assert reward == 1.0, meta


def test_a_batch_with_attacks_still_scores_the_good_samples(code_env):
    codes = ["print(input()[::-1])", "import os\nwhile True: os.fork()", "print(input()[::-1])"]
    result = code_env.step([answer(c) for c in codes], [{"tests": REVERSE_TESTS}] * 3)
    assert result.rewards.tolist() == [1.0, 0.0, 1.0]


def test_extract_code_takes_the_last_block():
    text = "```python\nprint(1)\n```\nbetter:\n```\nprint(2)\n```"
    assert extract_code(text).strip() == "print(2)"
    assert extract_code("```python\nprint(3)").strip() == "print(3)"
    assert extract_code("none") is None


def test_bad_tests_metadata_names_the_sample(code_env):
    with pytest.raises(KeyError, match="sample 0"):
        code_env.step([answer("print(1)")], [{"tests": [{"input": "x"}]}])
    with pytest.raises(ValueError, match="sample 0, test 1: the 'assert' test may hold only"):
        code_env.step(
            [answer("print(1)")],
            [{"tests": [{"assert": "assert f(1) == 1"}, {"assert": "x = f(1)\nassert x"}]}],
        )


def test_refuses_to_start_without_bubblewrap(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap anywhere on it
    require_sandbox.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
            CodeEnvironment({})
    finally:
        monkeypatch.undo()
        require_sandbox.cache_clear()
    assert require_sandbox().bwrap.endswith("bwrap")


def test_refuses_when_bubblewrap_cannot_build_the_sandbox():
    """A bwrap that cannot create namespaces (here: one that only fails) is refused, loudly."""
    with pytest.raises(SandboxUnavailableError, match="user namespaces"):
        probe_boundary("false")


def test_runs_from_a_process_with_over_a_thousand_open_files():
    """A training process holds many descriptors: select() would fail past 1024, poll() works."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), max(hard, 2048)))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        assert run_sandboxed("print(input()[::-1])", "abc\n").stdout == "cba\n"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
