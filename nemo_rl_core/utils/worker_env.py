"""NeMo RL's ``env_vars`` of a model's worker (``dtensor_cfg``, ``megatron_cfg``,
``vllm_cfg``), applied to the process that holds the model here.

NeMo RL starts each worker (a Ray actor) with the section's ``env_vars`` over the driver's
environment, so they are set before the worker imports anything. Here the model lives in
the stage's own process, which started before the config was read: the variables are set
in its environment when the run builds the model (and reach the Megatron ranks torchrun
starts, which inherit it), and put back when the run's warm objects close. The one kind
of variable read once per process, the CUDA caching allocator's settings
(``PYTORCH_CUDA_ALLOC_CONF``, which NeMo RL's DPO config sets), is applied to the running
allocator as well where CUDA has already started.
"""

import os
from collections.abc import Mapping

ALLOCATOR_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class WorkerEnvironment:
    """The environment variables the run's models asked for, set in this process; two
    sections asking one variable for different values are refused (NeMo RL's workers are
    separate processes, the stage here is one)."""

    def __init__(self) -> None:
        self._before: dict[str, str | None] = {}
        self._set_by: dict[str, tuple[str, str]] = {}

    def apply(self, env_vars: Mapping[str, str] | None, key: str) -> None:
        """Set ``env_vars`` (the config key ``key``, for errors) in this process."""
        for name, raw in (env_vars or {}).items():
            value = str(raw)
            earlier = self._set_by.get(name)
            if earlier is not None and earlier[1] != value:
                raise ValueError(
                    f"{key}.{name}={value!r} differs from {earlier[0]}.{name}={earlier[1]!r}: "
                    "NeMo RL gives each worker its own process, and here both models run in "
                    "the stage's process; set them alike"
                )
            self._before.setdefault(name, os.environ.get(name))
            os.environ[name] = value
            self._set_by[name] = (key, value)
            if name in ALLOCATOR_VARIABLES and value:
                _configure_running_allocator(value)

    def restore(self) -> None:
        """Put back the variables as they were before :meth:`apply`."""
        for name, value in self._before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._before.clear()
        self._set_by.clear()


def _configure_running_allocator(settings: str) -> None:
    """The CUDA allocator reads its settings when CUDA starts; after that, torch takes new
    ones through this call (which is what the variable would have set)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.memory._set_allocator_settings(settings)
