"""What a host offers the code sandbox: bubblewrap, setpriv, an interpreter an unprivileged
uid can run, the directories to bind, the seccomp filter and a delegated cgroup, if any."""

import ctypes
import ctypes.util
import errno
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from nemo_rl_core.environments.sandbox_cgroup import CgroupParents, delegated_cgroups

_SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/lib", "/lib64")
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


class SandboxUnavailableError(RuntimeError):
    """This host cannot build the sandbox; code rewards would not be trustworthy here."""


@dataclass(frozen=True)
class Boundary:
    """What this host gives the sandbox, probed once by ``require_sandbox``."""

    bwrap: str
    interpreter: str
    binds: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
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
            f"({len(_DENIED_SYSCALLS)} syscalls denied), rlimits, {cgroup}, {uid}; "
            f"interpreter {self.interpreter}"
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
    binds, links = _mounts(interpreter)
    return Boundary(
        path, interpreter, binds, links, setpriv, _seccomp_filter(), delegated_cgroups()
    )


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


def _mounts(interpreter: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """Read-only binds (the interpreter, its stdlib and libraries) and symlinks (/lib -> usr/lib)."""
    query = (
        "import json, sysconfig; print(json.dumps([sysconfig.get_paths()['stdlib'], "
        "sysconfig.get_paths()['platstdlib'], sysconfig.get_config_var('LIBDIR') "
        "if sysconfig.get_config_var('Py_ENABLE_SHARED') else None]))"
    )
    found = subprocess.run(
        [interpreter, "-I", "-S", "-c", query], capture_output=True, text=True, check=True
    )
    wanted = [interpreter] + [p for p in json.loads(found.stdout) if p]
    links = []
    for path in _SYSTEM_LIBRARIES:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            wanted.append(path)
    binds: list[str] = []
    for path in sorted({os.path.realpath(p) for p in wanted}):
        if not any(path.startswith(outer + os.sep) for outer in binds):
            binds.append(path)
    return tuple(binds), tuple(links)


def _seccomp_filter() -> bytes:
    """The BPF program denying ``_DENIED_SYSCALLS`` (EPERM), exported by libseccomp."""
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
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SCMP_ACT_ALLOW, SCMP_ACT_ERRNO(EPERM)
    context = lib.seccomp_init(allow)
    fd = os.memfd_create("nemo_rl_seccomp")
    try:
        for syscall in _DENIED_SYSCALLS:
            number = lib.seccomp_syscall_resolve_name(syscall.encode())
            if number >= 0 and lib.seccomp_rule_add(context, deny, number, 0) != 0:
                raise SandboxUnavailableError(f"libseccomp refused a rule for {syscall}")
        if lib.seccomp_export_bpf(context, fd) != 0:
            raise SandboxUnavailableError("libseccomp could not export the seccomp filter")
        return os.pread(fd, os.fstat(fd).st_size, 0)
    finally:
        lib.seccomp_release(context)
        os.close(fd)
