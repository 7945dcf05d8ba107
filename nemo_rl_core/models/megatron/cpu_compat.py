"""Run megatron-core 0.16.1 on a CPU-only torch (gloo), by redirecting its hard-coded CUDA calls.

megatron-core assumes CUDA in a few places that have nothing to do with the math:
RNG state save/restore (``tensor_parallel.random``), ``torch.cuda.current_device()`` as the
device of buffers, a causal-mask helper that builds its mask with ``device="cuda"``,
``device="cuda"`` literals in the schedules, DDP buffers and optimizer, and
``param.type() == 'torch.cuda.FloatTensor'`` assertions in the optimizer and grad clipping.
This module redirects exactly those, only when no CUDA device is present, and only for
the megatron-core version it was written against: the patch points are listed in
``PATCH_POINTS`` and checked before anything is patched, so an upgrade fails loudly here
instead of silently training wrong.

Two mechanisms, chosen to keep the forward pass free of overhead:
- module-level replacements (RNG helpers, causal mask, ``torch.cuda.current_device``) and a
  ``torch`` proxy installed as the ``torch`` global of the schedules module, which maps
  ``device="cuda"`` in tensor factories to the CPU;
- ``cuda_as_cpu()``, a context manager (a ``TorchFunctionMode``) for the code that also
  checks ``Tensor.type()`` strings or calls ``Tensor.cuda()``: DDP and optimizer
  construction, ``optimizer.step()``, optimizer state loading. Callers wrap those calls.
"""

import contextlib
import functools
import importlib
import inspect
from collections.abc import Callable, Collection, Iterator
from types import ModuleType
from typing import Any

import torch

MEGATRON_CORE_VERSION = "0.16.1"

# (module, attribute, parameter names it must still have, source fragment it must still
# contain or None). The fragments are the CUDA assumptions this module works around.
PATCH_POINTS: tuple[tuple[str, str, tuple[str, ...], str | None], ...] = (
    ("megatron.core.tensor_parallel.random", "_get_cuda_rng_state", ("device", "clone", "graph_safe"), None),
    ("megatron.core.tensor_parallel.random", "_set_cuda_rng_state", ("new_state", "device", "graph_safe"), None),
    ("megatron.core.tensor_parallel.random", "model_parallel_cuda_manual_seed", ("seed",), "torch.cuda"),
    ("megatron.core.transformer.utils", "get_default_causal_mask", ("sq",), 'device="cuda"'),
    ("megatron.core.fusions.fused_softmax", "get_default_causal_mask", ("sq",), 'device="cuda"'),
    ("megatron.core.pipeline_parallel.schedules", "forward_backward_no_pipelining", ("forward_step_func", "data_iterator", "model", "num_microbatches", "forward_only"), 'device="cuda"'),
    ("megatron.core.optimizer.clip_grads", "get_grad_norm_fp32", ("grads_for_norm", "norm_type"), "device='cuda'"),
    ("megatron.core.optimizer.clip_grads", "clip_grad_by_total_norm_fp32", ("parameters", "max_norm", "total_norm"), "torch.cuda.FloatTensor"),
    ("megatron.core.optimizer.optimizer", "FP32Optimizer", ("optimizer", "config", "init_state_fn"), None),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer", ("optimizer", "config", "grad_scaler", "init_state_fn", "model_chunks", "per_model_buffers", "data_parallel_group", "data_parallel_group_gloo", "data_parallel_group_idx"), None),
    ("megatron.core.distributed.distributed_data_parallel", "DistributedDataParallel", ("config", "ddp_config", "module"), None),
)  # fmt: skip

_APPLIED = False
# megatron-core's own functions this module replaced: verify_patch_points checks these, so a
# check made after the patches (another test, a second policy in one process) still sees them.
_REPLACED: dict[tuple[str, str], Any] = {}


class MegatronCoreVersionError(RuntimeError):
    """The installed megatron-core is not the version the CPU compatibility layer targets."""


def megatron_core_version() -> str:
    import megatron.core

    return megatron.core.__version__


def verify_patch_points() -> None:
    """Fail naming the first patch point that moved, if megatron-core is not 0.16.1."""
    version = megatron_core_version()
    if version != MEGATRON_CORE_VERSION:
        raise MegatronCoreVersionError(
            f"nemo_rl_core.models.megatron.cpu_compat targets megatron-core=={MEGATRON_CORE_VERSION}, "
            f"found {version}; install megatron-core=={MEGATRON_CORE_VERSION} or re-check every "
            "entry of PATCH_POINTS against the new version"
        )
    for module_name, attr, params, fragment in PATCH_POINTS:
        module = importlib.import_module(module_name)
        target = _REPLACED.get((module_name, attr), getattr(module, attr, None))
        if target is None:
            raise MegatronCoreVersionError(f"{module_name}.{attr} no longer exists")
        signature = inspect.signature(target.__init__ if inspect.isclass(target) else target)
        missing = [p for p in params if p not in signature.parameters]
        if missing:
            raise MegatronCoreVersionError(
                f"{module_name}.{attr}{signature} lost parameters {missing}; "
                "the CPU compatibility layer must be revised"
            )
        if fragment is not None and fragment not in inspect.getsource(target):
            raise MegatronCoreVersionError(
                f"{module_name}.{attr} no longer contains {fragment!r}; "
                "the CPU compatibility layer must be revised"
            )


def _is_cuda(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


class _CpuTorch(ModuleType):
    """``torch`` as seen by one megatron module: tensor factories put "cuda" tensors on the CPU."""

    _FACTORIES = frozenset({"zeros", "ones", "empty", "full", "tensor", "arange"})

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str) -> Any:
        value = getattr(torch, name)
        if name not in self._FACTORIES:
            return value

        @functools.wraps(value)
        def factory(*args: Any, **kwargs: Any) -> torch.Tensor:
            if _is_cuda(kwargs.get("device")):
                kwargs["device"] = "cpu"
            kwargs.pop("pin_memory", None)
            return value(*args, **kwargs)

        return factory


def _manual_seed(seed: int) -> None:
    """``torch.cuda.manual_seed`` without CUDA: seed the CPU generator megatron's RNG uses."""
    torch.default_generator.manual_seed(int(seed))


class _CudaAsCpuMode(torch.overrides.TorchFunctionMode):
    """Map CUDA devices to the CPU and report CPU tensors as CUDA types, inside the block."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Collection[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if _is_cuda(kwargs.get("device")):
            kwargs = dict(kwargs, device="cpu")
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_as_cpu() -> Iterator[None]:
    """Run megatron's DDP/optimizer code that hard-codes CUDA; a no-op when CUDA exists."""
    if torch.cuda.is_available():
        yield
        return
    with _CudaAsCpuMode():
        yield


@functools.lru_cache(maxsize=32)
def _causal_mask(sq: int) -> torch.Tensor:
    """megatron's default causal mask (True = masked), built on the CPU."""
    return torch.triu(torch.ones(sq, sq, dtype=torch.bool), diagonal=1)


def _get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_rng_state(new_state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    torch.set_rng_state(new_state)


def _replace(module: ModuleType, attr: str, value: Any) -> None:
    _REPLACED.setdefault((module.__name__, attr), getattr(module, attr))
    setattr(module, attr, value)


def apply_cpu_compat() -> bool:
    """Patch megatron-core for CPU if no CUDA device is present; True if patches are active.

    Idempotent. Raises ``MegatronCoreVersionError`` on any megatron-core but 0.16.1.
    """
    global _APPLIED
    if torch.cuda.is_available():
        return False
    if _APPLIED:
        return True
    verify_patch_points()
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.pipeline_parallel.schedules as schedules
    import megatron.core.tensor_parallel.random as mrandom
    import megatron.core.transformer.utils as transformer_utils

    # torch.cuda is unusable without CUDA, so redirecting it cannot change working code.
    torch.cuda.get_rng_state = _get_rng_state
    torch.cuda.set_rng_state = _set_rng_state
    torch.cuda.manual_seed = _manual_seed
    # Deliberately not torch's ``int``: megatron places buffers on ``current_device()``, and an
    # int would mean cuda:<n>; "cpu" is the device those buffers must go to here.
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.empty_cache = lambda *args, **kwargs: None
    _replace(mrandom, "_get_cuda_rng_state", _get_rng_state)
    _replace(mrandom, "_set_cuda_rng_state", _set_rng_state)
    _replace(transformer_utils, "get_default_causal_mask", _causal_mask)
    _replace(fused_softmax, "get_default_causal_mask", _causal_mask)
    schedules.torch = _CpuTorch()
    _APPLIED = True
    return True
