"""How many CUDA devices this process may use, counted without importing torch.

The config check refuses what this machine cannot run before torch, vLLM or Prefect load
(issue 19: a mistake is reported within seconds). torch itself counts through NVML when it
can (``torch.cuda._device_count_nvml``); this does the same with the driver's library and
``CUDA_VISIBLE_DEVICES``.
"""

import ctypes
import importlib.metadata
import os


def visible_cuda_devices() -> int:
    """The CUDA devices torch would see: none with a CPU-only torch build or without an
    NVIDIA driver, else the driver's devices as ``CUDA_VISIBLE_DEVICES`` narrows them."""
    if _cpu_only_torch():
        return 0
    present = _nvml_device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    return min(present, _listed_devices(visible))


def _cpu_only_torch() -> bool:
    """PyTorch's CPU wheels carry the local version ``+cpu`` (``2.13.0+cpu``)."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return True
    return version.partition("+")[2].startswith("cpu")


def _nvml_device_count() -> int:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:  # no NVIDIA driver on this machine
        return 0
    if nvml.nvmlInit_v2() != 0:
        return 0
    try:
        count = ctypes.c_uint(0)
        return count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else 0
    finally:
        nvml.nvmlShutdown()


def _listed_devices(visible: str) -> int:
    """Entries of ``CUDA_VISIBLE_DEVICES`` up to the first invalid one (CUDA ignores the
    rest): ``""`` and ``"-1"`` hide every device."""
    count = 0
    for entry in visible.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count
