"""What a host offers the code sandbox: bubblewrap, setpriv, an interpreter an unprivileged
uid can run, the files that interpreter reads, the seccomp filter and a delegated cgroup."""

import atexit
import ctypes
import ctypes.util
import errno
import functools
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from nemo_rl_core.environments.sandbox_cgroup import CgroupParents, delegated_cgroups

# The devices a box gets: no terminal (/dev/ptmx handed out the host's ptys), no shm.
DEVICES = ("null", "zero", "full", "random", "urandom")
_DEVICE_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                 ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"))  # fmt: skip
# Syscalls no sandboxed Python program needs, each a common step of kernel exploits or of
# reaching other processes; they fail with EPERM.
_DENIED_SYSCALLS = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "quotactl",
)
# Sockets of any other family fail with EAFNOSUPPORT, as if not built into the kernel:
# CPython needs AF_UNIX at most (socketpair, multiprocessing, asyncio's self-pipe), and
# the network namespace already holds no interface but loopback. AF_VSOCK would reach
# the hypervisor of a VM host, AF_NETLINK the kernel.
_SOCKET_SYSCALLS = ("socket", "socketpair")


class SandboxUnavailableError(RuntimeError):
    """This host cannot build the sandbox; code rewards would not be trustworthy here."""


@dataclass(frozen=True)
class Boundary:
    """What this host gives the sandbox, probed once by ``require_sandbox``."""

    bwrap: str
    interpreter: str
    root: str  # a directory holding the interpreter and its libraries, bound read-only as /
    binds: tuple[str, ...]  # the interpreter's standard library, bound read-only in place
    setpriv: str | None  # set when started as root: runs bubblewrap as a pool uid
    seccomp_filter: bytes
    cgroups: CgroupParents | None

    def describe(self) -> str:
        cgroup = (
            f"cgroup v{self.cgroups.version} per run" if self.cgroups else "no delegated cgroup"
        )
        uid = "a pool uid per run" if self.setpriv else "the caller's uid"
        return (
            f"bubblewrap ({self.bwrap}): user/pid/net/ipc/uts/cgroup/mount namespaces, seccomp "
            f"({len(_DENIED_SYSCALLS)} syscalls denied, AF_UNIX sockets only), no terminal, "
            f"rlimits, {cgroup}, {uid}; interpreter {self.interpreter} and only what it reads"
        )


def host_boundary(bwrap: str) -> Boundary:
    """What this host offers for a sandbox built with ``bwrap``; not yet proven to run."""
    path = shutil.which(bwrap)
    if path is None:
        raise SandboxUnavailableError(
            f"bubblewrap ({bwrap!r}) is not installed: the code environment runs every sample "
            "in it and has no weaker fallback (Debian/Ubuntu: apt-get install bubblewrap)"
        )
    setpriv = None
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailableError(
                "running as root, the sandbox drops to a uid of its own with setpriv, which is "
                "not installed (Debian/Ubuntu: apt-get install util-linux)"
            )
    interpreter = _interpreter(setpriv is not None)
    root, binds = system_image(interpreter)
    return Boundary(path, interpreter, root, binds, setpriv, _seccomp_filter(), delegated_cgroups())


def _interpreter(drop_to_uid: bool) -> str:
    """A Python the run's uid can reach: this one when its whole path is world-executable."""
    candidates = [os.path.realpath(sys.executable)]
    if drop_to_uid:
        candidates += [os.path.realpath(p) for p in ("/usr/bin/python3", "/usr/local/bin/python3")]
    for candidate in candidates:
        if os.path.exists(candidate) and (not drop_to_uid or _world_reachable(candidate)):
            return candidate
    raise SandboxUnavailableError(
        f"no Python that an unprivileged uid can run: {candidates} (install python3, or make "
        "this interpreter's directories world-executable)"
    )


def _world_reachable(path: str) -> bool:
    parts = path.split(os.sep)
    dirs = [os.sep.join(parts[:i]) or os.sep for i in range(1, len(parts))]
    return all(os.stat(d).st_mode & 0o001 for d in dirs) and bool(os.stat(path).st_mode & 0o001)


@functools.cache
def system_image(interpreter: str) -> tuple[str, tuple[str, ...]]:
    """A root for boxes: the interpreter, the shared libraries it and its standard
    library's extension modules link (by ``ldd``), the symlinks leading to them, and mount
    points (``/proc``, ``/box``, ``/dev``'s devices). Returns it and the standard library
    directories to bind over it.

    Files are hard links where the filesystem allows (copies elsewhere), made once per
    process in a private directory that goes at exit. One bind of this root costs a box
    what one bind of ``/usr/lib`` did; a bind per library would cost ~0.7 ms each.
    """
    query = (
        "import json, sysconfig; print(json.dumps([sysconfig.get_paths()['stdlib'], "
        "sysconfig.get_paths()['platstdlib'], sysconfig.get_config_var('DESTSHARED')]))"
    )
    found = subprocess.run(
        [interpreter, "-I", "-S", "-c", query], capture_output=True, text=True, check=True
    )
    stdlib, platstdlib, extensions = json.loads(found.stdout)
    binds: list[str] = []
    for path in sorted({os.path.realpath(p) for p in (stdlib, platstdlib)}):
        if not any(path.startswith(outer + os.sep) for outer in binds):
            binds.append(path)
    image = tempfile.mkdtemp(prefix="nemo_rl_sandbox_root_")
    atexit.register(shutil.rmtree, image, ignore_errors=True)
    os.chmod(image, 0o755)  # the box's uid must traverse it
    modules = glob.glob(os.path.join(extensions, "*.so")) if extensions else []
    for path in [interpreter, *_shared_libraries([interpreter, *modules])]:
        _mirror(image, path)
    for path in [*binds, "/proc", "/box", "/dev"]:
        os.makedirs(image + path, mode=0o755, exist_ok=True)
    for device in DEVICES:
        open(f"{image}/dev/{device}", "w").close()  # noqa: SIM115 -- an empty mount point
    for name, target in _DEVICE_LINKS:
        os.symlink(target, f"{image}/dev/{name}")
    return image, tuple(binds)


def _shared_libraries(objects: list[str]) -> list[str]:
    """The shared libraries (and dynamic loader) ``objects`` load, as ``ldd`` resolves them."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise SandboxUnavailableError(
            "ldd is not installed: the sandbox binds only the libraries the interpreter links, "
            "found with it (Debian/Ubuntu: apt-get install libc-bin)"
        )
    listing = subprocess.run([ldd, *objects], capture_output=True, text=True).stdout
    return sorted(set(re.findall(r"^\s+(?:\S+ => )?(/\S+) \(0x", listing, re.MULTILINE)))


def _mirror(image: str, path: str) -> None:
    """Make ``path`` resolve inside ``image`` as it does on the host: its directories, the
    symlinks on the way (``/lib`` -> ``usr/lib``, ``libz.so.1`` -> ``libz.so.1.2.13``)
    and the file they lead to, linked or copied."""
    parts = path.strip(os.sep).split(os.sep)
    for depth in range(1, len(parts) + 1):
        current = os.sep + os.path.join(*parts[:depth])
        inside = image + current
        if os.path.islink(current):
            target = os.readlink(current)
            if not os.path.lexists(inside):
                os.symlink(target, inside)
            resolved = os.path.normpath(os.path.join(os.path.dirname(current), target))
            _mirror(image, os.path.join(resolved, *parts[depth:]))
            return
        if depth < len(parts):
            os.makedirs(inside, mode=0o755, exist_ok=True)
        elif not os.path.lexists(inside):
            try:
                os.link(current, inside)
            except OSError:  # another filesystem, or hard links refused: a copy
                shutil.copy2(current, inside)


_SCMP_CMP_NE = 1


class _ArgCompare(ctypes.Structure):
    """libseccomp's ``struct scmp_arg_cmp``: compare one syscall argument with a value."""

    _fields_ = (
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    )


def _seccomp_filter() -> bytes:
    """The BPF program denying ``_DENIED_SYSCALLS`` (EPERM) and sockets of any family but
    AF_UNIX (EAFNOSUPPORT), exported by libseccomp."""
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as error:
        raise SandboxUnavailableError(
            f"libseccomp is not installed ({error}); Debian/Ubuntu: apt-get install libseccomp2"
        ) from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCompare),
    ]  # fmt: skip
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SCMP_ACT_ALLOW, SCMP_ACT_ERRNO(EPERM)
    no_family = 0x00050000 | errno.EAFNOSUPPORT
    not_unix = _ArgCompare(0, _SCMP_CMP_NE, socket.AF_UNIX, 0)  # the first argument, the family
    context = lib.seccomp_init(allow)
    fd = os.memfd_create("nemo_rl_seccomp")
    try:
        for syscall in _DENIED_SYSCALLS:
            number = lib.seccomp_syscall_resolve_name(syscall.encode())
            if number >= 0 and lib.seccomp_rule_add(context, deny, number, 0) != 0:
                raise SandboxUnavailableError(f"libseccomp refused a rule for {syscall}")
        for syscall in _SOCKET_SYSCALLS:
            number = lib.seccomp_syscall_resolve_name(syscall.encode())
            rule = lib.seccomp_rule_add_array(context, no_family, number, 1, ctypes.byref(not_unix))
            if number < 0 or rule != 0:
                raise SandboxUnavailableError(f"libseccomp refused a rule for {syscall}")
        if lib.seccomp_export_bpf(context, fd) != 0:
            raise SandboxUnavailableError("libseccomp could not export the seccomp filter")
        return os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        lib.seccomp_release(context)
        os.close(fd)
