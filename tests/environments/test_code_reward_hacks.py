"""Issue 22's reward hacks: wrong code that used to score 1.0 now scores 0.

Each test keeps a baseline next to the hack (the honest answer still scores 1.0), so a
test that passes because everything scores 0 is impossible.
"""

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from sandbox_attacks import UNHOOKED, answer, processes_with, reward_of, token

from nemo_rl_core.environments.code_sandbox import run_sandboxed

ADD_TESTS = [{"assert": "assert add(2, 3) == 5"}, {"assert": "assert add(-1, 1) == 0"}]
RIGHT_ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return 0\n"
EXIT_TRICKS = {
    "os._exit": WRONG_ADD + "import os\nos._exit(0)",
    "sys.exit": WRONG_ADD + "import sys\nsys.exit(0)",
    "raise SystemExit": WRONG_ADD + "raise SystemExit",
    "excepthook": WRONG_ADD
    + "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\nraise ValueError",
    "atexit": WRONG_ADD + "import atexit, os\natexit.register(os._exit, 0)",
    "exiting thread": WRONG_ADD + "import os, threading, time\n"
    "threading.Thread(target=lambda: (time.sleep(0.01), os._exit(0))).start()",
    "always-equal result": "class Yes:\n"
    "    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
    "def add(a, b):\n    return Yes()",
    # beyond the issue: a report forged on every descriptor, with the right answers even
    "forged report": WRONG_ADD + "import json, os\n"
    "for fd in range(3, 64):\n"
    "    try:\n"
    "        os.write(fd, json.dumps({'results': [{'value': 5}, {'value': 0}]}).encode())\n"
    "    except OSError:\n        pass\n"
    "os._exit(0)",
}

# The old sandbox's one-line off switch (its path checks called builtins.any): the copy
# and dataset hacks below start with it, so they meet whatever boundary is really there.
SWITCH_OFF_PATH_CHECKS = "import builtins\nbuiltins.any = lambda items: True\n"


def test_the_honest_answer_scores(code_env):
    assert reward_of(code_env, RIGHT_ADD, ADD_TESTS) == (1.0, "all tests passed")
    assert reward_of(code_env, WRONG_ADD, ADD_TESTS)[0] == 0.0


@pytest.mark.parametrize("trick", EXIT_TRICKS)
def test_exit_tricks_score_zero(code_env, trick):
    reward, reason = reward_of(code_env, EXIT_TRICKS[trick], ADD_TESTS)
    assert reward == 0.0, (trick, reason)
    assert reason.startswith("test 0: "), reason


def test_a_sibling_solution_cannot_be_copied(code_env):
    """Two samples run at once; the copier searches everything it can see for the other."""
    honest = "# honest-sample\nimport time\ntime.sleep(1.0)\n" + RIGHT_ADD
    copier = (
        SWITCH_OFF_PATH_CHECKS + "import glob, os, time\ntime.sleep(0.3)\nsource = None\n"
        "paths = glob.glob('/tmp/nemo_rl_sandbox_*/box/solution.py')\n"
        "paths += glob.glob('/proc/*/root/box/*') + glob.glob('/proc/*/fd/*')\n"
        "paths += glob.glob('/proc/*/cmdline') + glob.glob('/box/*')\n"
        "for path in paths:\n"
        "    try:\n        text = open(path, errors='replace').read()\n"
        "    except OSError:\n        continue\n"
        "    if 'honest-' + 'sample' in text:\n"  # split: its own source must not match
        "        source = text\n        break\n"
        "exec(source or 'def add(a, b):\\n    return 0')\n"
    )
    # one test each, so the two workers run the two samples side by side
    result = code_env.step([answer(honest), answer(copier)], [{"tests": ADD_TESTS[:1]}] * 2)
    assert result.rewards.tolist() == [1.0, 0.0], [m["reward_reason"] for m in result.metadata]


@pytest.fixture
def world_readable_dataset():
    """A dataset with expected outputs where every host uid could read it."""
    directory = Path(tempfile.mkdtemp(prefix="nemo_rl_dataset_", dir="/tmp"))
    directory.chmod(0o755)
    dataset = directory / "tests.jsonl"
    dataset.write_text(json.dumps({"input": "abc", "output": "cba-" + token()}) + "\n")
    dataset.chmod(0o644)
    yield dataset
    shutil.rmtree(directory)


def test_a_world_readable_dataset_cannot_be_read(code_env, world_readable_dataset):
    expected = json.loads(world_readable_dataset.read_text())["output"]
    cheat = (
        SWITCH_OFF_PATH_CHECKS + "import glob, json\nline = input()\n"
        f"paths = [{str(world_readable_dataset)!r}] + glob.glob('/tmp/nemo_rl_dataset_*/*.jsonl')\n"
        "for path in paths:\n"
        "    try:\n        rows = [json.loads(l) for l in open(path)]\n"
        "    except OSError:\n        continue\n"
        "    print(next(r['output'] for r in rows if r['input'] == line))\n    break\n"
        "else:\n    print('no dataset')"
    )
    reward, reason = reward_of(code_env, cheat, [{"input": "abc\n", "output": expected}])
    assert reward == 0.0 and "wrong output" in reason
    # where the file is reachable (here: the host itself) the same program finds the answer
    host = subprocess.run(
        [sys.executable, "-c", cheat], input="abc\n", capture_output=True, text=True
    )
    assert host.stdout.strip() == expected


def test_a_leftover_process_cannot_rewrite_a_later_sample(code_env):
    """A setsid daemon that would rewrite later samples' code dies with its own run."""
    canary = token()
    daemon = (
        f"# {canary}\nimport glob, os, sys, time\nos.write(1, b'daemon alive\\n')\n"
        "for _ in range(300):\n"
        "    for path in glob.glob('/tmp/nemo_rl_sandbox_*/box/solution.py') + glob.glob("
        "'/proc/*/root/box/solution.py'):\n"
        "        try:\n"
        "            open(path, 'w').write('def add(a, b):\\n    return a + b\\n')\n"
        "        except OSError:\n            pass\n"
        "    time.sleep(0.01)\n"
    )
    planter = (
        UNHOOKED + f"spawn({daemon!r}, setsid=True)\nimport time\ntime.sleep(0.5)\nprint('planted')"
    )
    planted = run_sandboxed(planter)
    assert planted.ok and "daemon alive" in planted.stdout, planted  # it really ran
    assert processes_with(canary) == []  # and died with the run
    for _ in range(3):
        assert reward_of(code_env, WRONG_ADD, ADD_TESTS)[0] == 0.0
        time.sleep(0.2)
    assert processes_with(canary) == []


def test_an_answer_forged_on_the_judges_channel_still_has_to_decode(code_env):
    """A sample can find its sandbox's channel to the judge and write to it itself; an
    answer nested past the limit fails that sample only, as any malformed answer."""
    steal = (
        WRONG_ADD + "import os, sys\n"
        "replies = sys._getframe(1).f_locals['replies']\n"
        "nested = '{\"list\": [' * 300 + ']}' * 300\n"
        "answer = ('{\"value\": ' + nested + '}').encode()\n"
        "os.write(replies, len(answer).to_bytes(4, 'big') + answer)\n"
    )
    reward, reason = reward_of(code_env, steal, ADD_TESTS[:1])
    assert reward == 0.0 and "malformed value: nested deeper than 100 levels" in reason, reason
    assert reward_of(code_env, RIGHT_ADD, ADD_TESTS[:1]) == (1.0, "all tests passed")
