"""Issue 22's escapes, each contained by the boundary itself (bubblewrap and the kernel).

Most attacks run with the audit-hook filter off (``first_filter=False``) or from an
interpreter started past it (``UNHOOKED``), and check that they really ran, so the tests
show the namespaces, seccomp and limits holding on their own. Canaries only: files and
processes the tests create themselves.
"""

import errno
import marshal
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from sandbox_attacks import UNHOOKED, processes_with, token

from nemo_rl_core.environments.code_sandbox import SandboxLimits, require_sandbox, run_sandboxed
from nemo_rl_core.environments.sandbox_box import BOOTSTRAP, PROGRAMS, compiled_modules, memfd
from nemo_rl_core.environments.sandbox_uids import UidPool, live_processes


@pytest.fixture
def canary_dir():
    """A host directory any uid may enter, holding a secret file (0644)."""
    directory = Path(tempfile.mkdtemp(prefix="nemo_rl_canary_", dir="/tmp"))
    directory.chmod(0o755)
    secret = directory / "secret.txt"
    secret.write_text(token())
    secret.chmod(0o644)
    yield directory
    shutil.rmtree(directory)


def test_posixsubprocess_runs_programs_only_inside(canary_dir):
    secret = canary_dir / "secret.txt"
    child = (
        "import os\nprint('unhooked child ran')\n"
        "print(sorted(os.listdir('/')))\n"
        f"for path in ({str(secret)!r}, '/etc/passwd', '/bin/sh'):\n"
        "    try:\n        print(open(path).read())\n"
        "    except OSError as error:\n        print(type(error).__name__)\n"
        f"open({str(canary_dir / 'written')!r}, 'w')\n"
    )
    code = UNHOOKED + f"pid = spawn({child!r})\nos.waitpid(pid, 0)\n"
    # the other route: subprocess itself, with its audit call made a no-op
    code_via_subprocess = (
        UNHOOKED + "import subprocess, types\nsys.modules['_posixsubprocess'] = _ps\n"
        "subprocess.sys = types.SimpleNamespace(**{k: getattr(sys, k) for k in dir(sys) "
        "if k != 'audit' and not k.startswith('__')}, audit=lambda *a: None)\n"
        f"subprocess.run([sys.executable, '-I', '-S', '-c', {child!r}])\n"
        "subprocess.run(['/bin/sh', '-c', 'echo shell'])\n"
    )
    for program in (code, code_via_subprocess):
        result = run_sandboxed(program)
        assert "unhooked child ran" in result.stdout, result
        assert "['box', 'dev', 'lib', 'lib64', 'proc', 'usr']" in result.stdout
        assert secret.read_text() not in result.stdout
        assert result.stdout.count("FileNotFoundError") == 3 and "shell" not in result.stdout
    assert sorted(p.name for p in canary_dir.iterdir()) == ["secret.txt"]


def test_patched_builtins_paths_and_lying_strings_open_nothing(canary_dir):
    secret = canary_dir / "secret.txt"
    code = (
        "import builtins, os, posixpath\n"
        "builtins.any = lambda items: True\n"
        "posixpath.abspath = lambda path: '/box/x'\nos.path.realpath = lambda path: '/box/x'\n"
        "class Lying(str):\n    def __str__(self):\n        return '/box/x'\n"
        f"for path in ({str(secret)!r}, Lying({str(secret)!r})):\n"
        "    try:\n        print(open(path).read())\n"
        "    except OSError as error:\n        print(type(error).__name__)\n"
    )
    for first_filter in (True, False):
        result = run_sandboxed(code, first_filter=first_filter)
        assert result.stdout.split() == ["FileNotFoundError"] * 2, result


def test_native_code_loaded_from_the_box_stays_inside(canary_dir):
    secret = canary_dir / "secret.txt"
    code = (
        "import ctypes, glob, os, shutil, sqlite3, sysconfig\n"
        "so = glob.glob(os.path.join(sysconfig.get_path('platstdlib'), 'lib-dynload', '*.so'))[0]\n"
        "shutil.copy(so, '/box/native.so')\n"
        "con = sqlite3.connect(':memory:')\n"
        "if hasattr(con, 'enable_load_extension'):\n"
        "    con.enable_load_extension(True)\n"
        "    try:\n        con.load_extension('/box/native.so')\n"
        "    except sqlite3.OperationalError as error:\n"
        "        print('sqlite loaded it' if 'cannot open' not in str(error) else error)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"print('open', libc.open({str(secret).encode()!r}, 0), ctypes.get_errno())\n"
        "for name, args in (('unshare', (0x10000000,)), ('mount', (b'none', b'/box', b'tmpfs', 0, None)),"
        " ('ptrace', (0, 0, 0, 0)), ('chroot', (b'/box',))):\n"
        "    ctypes.set_errno(0)\n"
        "    print(name, getattr(libc, name)(*args), ctypes.get_errno())\n"
    )
    result = run_sandboxed(code, first_filter=False)
    assert result.ok, result
    lines = result.stdout.splitlines()
    if lines[0] == "sqlite loaded it":  # Debian's sqlite3 module can load extensions
        lines = lines[1:]
    assert lines[0] == f"open -1 {errno.ENOENT}"
    assert lines[1:] == [
        f"{name} -1 {errno.EPERM}" for name in ("unshare", "mount", "ptrace", "chroot")
    ]


WRITABLE_LOOKING = ("/box", "/tmp", "/dev/shm", "/var/tmp", "/", "/dev", "/usr/lib")


def test_nothing_written_persists_between_runs():
    canary = token()
    writer = (
        "import os\n"
        f"for directory in {WRITABLE_LOOKING!r}:\n"
        "    try:\n"
        f"        open(os.path.join(directory, {canary!r}), 'w').write('x')\n"
        "        print('wrote', directory)\n"
        "    except OSError as error:\n"
        "        print('refused', directory, type(error).__name__)\n"
    )
    written = run_sandboxed(writer, first_filter=False)
    assert written.stdout.splitlines()[0] == "wrote /box"
    assert all(line.startswith("refused") for line in written.stdout.splitlines()[1:]), written
    reader = (
        "import os\n"
        f"print(os.listdir('/box'), [d for d in {WRITABLE_LOOKING!r} if os.path.exists(d + '/{canary}')])"
    )
    assert run_sandboxed(reader, first_filter=False).stdout.strip() == "[] []"
    host = [Path(d) / canary for d in ("/tmp", "/dev/shm", "/var/tmp")]
    assert not any(path.exists() for path in host)


def test_host_processes_are_invisible():
    canary = token()
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", canary])
    try:
        code = (
            "import glob\nfound = []\n"
            "for path in glob.glob('/proc/[0-9]*/cmdline'):\n"
            "    found.append(open(path, 'rb').read())\n"
            f"print(len(found), any({canary.encode()!r} in c for c in found))"
        )
        result = run_sandboxed(code, first_filter=False)
        # only the box's own: its first process and the program
        assert result.stdout.split() == ["2", "False"], result
    finally:
        host.kill()
        host.wait()


def test_setsid_daemons_die_with_their_run():
    canary = token()
    daemon = f"# {canary}\nimport os, time\nos.write(1, b'daemon up\\n')\ntime.sleep(30)"
    finishes = UNHOOKED + f"spawn({daemon!r}, setsid=True)\nimport time\ntime.sleep(0.3)"
    hangs = finishes + "\ntime.sleep(60)"
    for code, limits in ((finishes, None), (hangs, SandboxLimits(wall_time_s=1))):
        result = run_sandboxed(code, limits=limits)
        assert "daemon up" in result.stdout, result
        assert processes_with(canary) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid pool is used when started as root")
def test_a_uid_returns_to_the_pool_only_once_nothing_runs_as_it():
    pool, other_process = UidPool(), UidPool()  # the same uid block, as with a pid clash
    survivor_uid = pool.take()
    next_uid = pool._free[-1]  # the next take() would hand this one out
    sleepers = [
        subprocess.Popen(
            ["sleep", "30"], preexec_fn=lambda uid=uid: (os.setgid(uid), os.setuid(uid))
        )
        for uid in (survivor_uid, next_uid)
    ]
    try:
        assert live_processes(next_uid) == [sleepers[1].pid]
        third_uid = pool.take()
        assert third_uid not in (survivor_uid, next_uid)  # busy uids are never handed out
        assert other_process.take() not in (survivor_uid, next_uid, third_uid)  # held: locked
        pool.give(survivor_uid)  # a straggler is killed before its uid goes back
        assert sleepers[0].wait(timeout=5) == -9 and live_processes(survivor_uid) == []
        assert survivor_uid in pool._free
        pool.give(third_uid)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


@pytest.mark.skipif(
    require_sandbox().cgroups is None, reason="no delegated cgroup: memory is capped per process"
)
def test_children_share_one_memory_limit():
    """Children that hold 150 MB each, counted once every one holds or has died."""
    code = (
        "import os, time\nr, w = os.pipe()\nos.set_blocking(r, False)\npids = []\n"
        "for _ in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = b'x' * (150 << 20)\n"
        "        os.write(w, b'%08d' % os.getpid())\n        time.sleep(60)\n"
        "    pids.append(pid)\n"
        "holding, dead, deadline = set(), set(), time.monotonic() + 8\n"
        "while len(holding | dead) < len(pids) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "    try:\n        data = os.read(r, 4096)\n    except BlockingIOError:\n        data = b''\n"
        "    holding |= {int(data[i:i + 8]) for i in range(0, len(data), 8)}\n"
        "    dead |= {p for p in pids if p not in dead and os.waitpid(p, os.WNOHANG) != (0, 0)}\n"
        "print('holders', len(holding - dead), 'settled', len(holding | dead) == len(pids))\n"
    )
    limits = SandboxLimits(memory_mb=256, wall_time_s=20)
    result = run_sandboxed(code, limits=limits, first_filter=False)
    # each child alone fits its 256 MB address space; together they may not pass 256 MB
    assert result.stdout.split() in (["holders", n, "settled", "True"] for n in "01"), result
    alone = run_sandboxed(code.replace("range(4)", "range(1)"), limits=limits, first_filter=False)
    assert alone.stdout.split() == ["holders", "1", "settled", "True"], alone


def test_host_unix_sockets_are_unreachable(canary_dir):
    path = canary_dir / "host.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    path.chmod(0o777)
    abstract = socket.socket(socket.AF_UNIX)
    abstract_name = "\0" + token()
    abstract.bind(abstract_name)
    for listener in (server, abstract):
        listener.listen(1)
        listener.settimeout(0.3)
    try:
        code = (
            "import socket\n"
            f"for address in ({str(path)!r}, {abstract_name!r}):\n"
            "    s = socket.socket(socket.AF_UNIX)\n"
            "    try:\n        s.connect(address)\n        print('connected')\n"
            "    except OSError as error:\n        print(type(error).__name__)\n"
        )
        result = run_sandboxed(code, first_filter=False)
        assert result.stdout.split() == ["FileNotFoundError", "ConnectionRefusedError"], result
        for listener in (server, abstract):
            with pytest.raises(TimeoutError):
                listener.accept()
    finally:
        server.close()
        abstract.close()


def test_bubblewrap_holds_no_host_descriptor_for_the_sample():
    """A program sees only its stdio: the job, report, status and seccomp descriptors are shut."""
    code = "import os\nprint(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))"
    result = run_sandboxed(code, first_filter=False)
    fds = eval(result.stdout)  # noqa: S307 -- a list of ints printed by the test's own code
    assert fds[:3] == [0, 1, 2] and len(fds) == 4, fds  # the 4th: the listing's own


def test_only_unix_sockets_can_be_made():
    """Issue 33: AF_VSOCK reached the hypervisor; the interpreter needs AF_UNIX at most."""
    code = (
        "import socket\n"
        "for name in ('AF_INET', 'AF_INET6', 'AF_NETLINK', 'AF_PACKET', 'AF_VSOCK'):\n"
        "    family = getattr(socket, name, None)\n"
        "    if family is None:\n        continue\n"
        "    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_RAW):\n"
        "        try:\n            socket.socket(family, kind).close()\n"
        "            print(name, kind, 'made')\n"
        "        except OSError:\n            pass\n"
        "a, b = socket.socketpair()\na.sendall(b'unix ok')\nprint(b.recv(16).decode())\n"
    )
    result = run_sandboxed(code, first_filter=False)
    assert result.ok, result
    assert result.stdout.splitlines() == ["unix ok"], result.stdout


def test_no_terminal_and_only_the_devices_python_uses():
    """Issue 33: /dev/ptmx handed out host ptys (826 of 3,072 in one run)."""
    code = (
        "import os\nprint(sorted(os.listdir('/dev')))\n"
        "for opener in (os.openpty, lambda: os.open('/dev/ptmx', os.O_RDWR),"
        " lambda: os.open('/dev/tty', os.O_RDWR)):\n"
        "    try:\n        opener()\n        print('opened')\n"
        "    except OSError as error:\n        print(type(error).__name__)\n"
        "print(len(os.urandom(8)), open('/dev/zero', 'rb').read(2), open('/dev/null').read())\n"
    )
    result = run_sandboxed(code, first_filter=False)
    assert result.ok, result
    devices, *opened, reads = result.stdout.splitlines()
    assert devices == str(
        sorted(["fd", "full", "null", "random", "stderr", "stdin", "stdout", "urandom", "zero"])
    )
    assert opened == ["FileNotFoundError"] * 3
    assert reads == "8 b'\\x00\\x00' "


def test_only_the_interpreter_its_stdlib_and_their_libraries_are_bound():
    """Issue 33: all of /usr/lib was readable; the box holds what the interpreter loads."""
    boundary = require_sandbox()
    query = (
        "import os, sysconfig\nstdlib = sysconfig.get_paths()['stdlib']\n"
        "for top in ('/usr', '/lib', '/lib64'):\n"
        "    for root, dirs, files in os.walk(top):\n"
        "        real = os.path.realpath(root)\n"
        "        if real == stdlib or real.startswith(stdlib + '/'):\n            continue\n"
        "        for name in files:\n            print(os.path.realpath(os.path.join(root, name)))\n"
    )
    result = run_sandboxed(query, first_filter=False)
    assert result.ok, result
    visible = result.stdout.split()
    assert boundary.interpreter in visible
    others = [path for path in set(visible) if path != boundary.interpreter]
    assert others and all(".so" in os.path.basename(path) for path in others), others
    assert len(others) < 60, others  # the interpreter's and its extensions' libraries
    # a library the interpreter never loads, present on the host, stays out
    unused = [p for p in Path("/usr/lib").rglob("libpam*.so*") if p.is_file()]
    assert not set(map(str, unused)) & set(visible)


def test_the_audit_filter_keeps_its_lists_when_the_sample_rebinds_names():
    """Issue 33: the filter read its lists from module globals the sample could rebind."""
    code = (
        "import sys\n"
        "for module in list(sys.modules.values()):\n"
        "    for name in dir(module):\n"
        "        if name.startswith('_BLOCKED'):\n"
        "            setattr(module, name, type(getattr(module, name))())\n"
        "for attempt in ('import os\\nos.fork()', 'import ctypes'):\n"
        "    try:\n        exec(attempt)\n        print('allowed')\n"
        "    except PermissionError as error:\n        print(error)\n"
    )
    result = run_sandboxed(code)
    assert result.stdout.splitlines() == [
        "sandbox: os.fork is not allowed",
        "sandbox: import of ctypes is not allowed",
    ], result


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the harness as a pool uid, with setpriv")
def test_the_harness_refuses_to_run_outside_a_sandbox():
    """Its clean-up kills every other process of its pid namespace (kill(-1) as pid 1);
    anywhere else that would reach every process its user may signal. Run here as a pool
    uid of its own beside a canary of that uid, so a regression harms nothing else."""
    boundary, pool = require_sandbox(), UidPool()
    uid = pool.take()
    as_uid = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    canary = subprocess.Popen([*as_uid, "sleep", "30"])
    code = compiled_modules(boundary.interpreter)
    job = {
        "modules": [(name, code[name]) for name in PROGRAMS["code_harness"]],
        "main": "code_harness",
        "source": "print(1)",
        "stdins": [""],
        "serve": False,
        "rlimits": {},
        "first_filter": False,
        "wall_time_s": 5,
        "output_bytes": 1000,
    }
    result_fd = memfd("result")
    job_fd = memfd("job", marshal.dumps({**job, "result_fd": result_fd}))
    try:
        run = subprocess.run(
            [*as_uid, boundary.interpreter, "-I", "-S", "-B", "-c", BOOTSTRAP, str(job_fd)],
            pass_fds=(job_fd, result_fd),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert run.returncode != 0 and "only as the first process" in run.stderr, run
        assert canary.poll() is None
    finally:
        os.close(job_fd)
        os.close(result_fd)
        canary.kill()
        canary.wait()
        pool.give(uid)
