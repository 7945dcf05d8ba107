"""Which lock ``make setup`` builds, and that it says why: the CUDA lock where ``nvidia-smi
-L`` lists a GPU, the CPU lock elsewhere, a forced CUDA lock refused without a GPU, and an
environment synced again when it was built from the other lock.

Make runs dry (``-n``) against a scratch ``VENV``: nothing is installed. The machine has no
GPU, so the GPU case puts an ``nvidia-smi`` that prints the driver's ``-L`` listing first on
PATH; every other case runs with no ``nvidia-smi`` at all."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CPU_LOCK, CUDA_LOCK = "requirements/lock.txt", "requirements/lock-cuda.txt"
H100_LISTING = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5a1f0c2e-0000-0000-0000-000000000000)"


def path_without_nvidia_smi() -> str:
    return os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "nvidia-smi").exists()
    )


def make_setup(venv: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "-n", "--no-print-directory", "setup", f"VENV={venv}", *args],
        cwd=REPO,
        env={**os.environ, "PATH": path or path_without_nvidia_smi()},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def nvidia_smi_listing(tmp_path: Path) -> str:
    """PATH with an nvidia-smi whose ``-L`` lists one H100."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(f'#!/bin/sh\n[ "$1" = -L ] && echo "{H100_LISTING}"\n')
    script.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{path_without_nvidia_smi()}"


def test_without_a_gpu_setup_takes_the_cpu_lock_and_says_why(tmp_path: Path) -> None:
    result = make_setup(tmp_path / "venv")
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first == (
        f'echo "setup: {CPU_LOCK} (no nvidia-smi on PATH; LOCK={CUDA_LOCK} forces the other)"'
    )
    assert f"pip sync --python {tmp_path}/venv/bin/python" in result.stdout
    assert f"{CPU_LOCK}\n" in result.stdout and CUDA_LOCK not in result.stdout.split("\n", 1)[1]


def test_with_a_gpu_listed_setup_takes_the_cuda_lock_without_the_cpu_wheels(
    tmp_path: Path, nvidia_smi_listing: str
) -> None:
    result = make_setup(tmp_path / "venv", path=nvidia_smi_listing)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        f'echo "setup: {CUDA_LOCK} (nvidia-smi -L lists 1 GPU; LOCK={CPU_LOCK} forces the other)"'
    )
    sync = next(line for line in result.stdout.splitlines() if "pip sync" in line)
    # The local wheel folder holds torch+cpu, which would satisfy the CUDA lock's torch pin.
    assert sync.endswith(CUDA_LOCK) and "--find-links" not in sync
    assert f"echo {CUDA_LOCK} > {tmp_path}/venv/.installed" in result.stdout


def test_forcing_the_cuda_lock_without_a_gpu_is_refused_unless_forced_again(
    tmp_path: Path,
) -> None:
    refused = subprocess.run(
        ["make", "--no-print-directory", "which-lock", f"LOCK={CUDA_LOCK}"],
        cwd=REPO,
        env={**os.environ, "PATH": path_without_nvidia_smi()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert refused.stdout == f"setup: {CUDA_LOCK} (LOCK given; no nvidia-smi on PATH)\n"
    assert f"refusing {CUDA_LOCK} here" in refused.stderr
    assert "FORCE_LOCK=1" in refused.stderr
    forced = make_setup(tmp_path / "venv", f"LOCK={CUDA_LOCK}", "FORCE_LOCK=1")
    assert forced.returncode == 0 and "refusing" not in forced.stdout + forced.stderr


def test_a_lock_that_is_neither_is_refused_naming_both(tmp_path: Path) -> None:
    result = make_setup(tmp_path / "venv", "LOCK=requirements/other.txt")
    assert result.returncode != 0
    assert f"LOCK=requirements/other.txt is neither lock: use {CPU_LOCK}" in result.stderr


@pytest.mark.parametrize(("stamped", "synced"), [(CPU_LOCK, False), (CUDA_LOCK, True)])
def test_the_stamp_names_its_lock_and_another_lock_syncs_again(
    tmp_path: Path, stamped: str, synced: bool
) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed").write_text(f"{stamped}\n")  # newer than every prerequisite
    result = make_setup(venv)
    assert result.returncode == 0, result.stderr
    assert ("pip sync" in result.stdout) is synced, result.stdout
