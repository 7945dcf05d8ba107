"""Names a package re-exports from a submodule that loads torch, imported on first use.

NeMo RL's paths name interfaces at the package (``nemo_rl.models.generation``); here the
same packages also hold the config modules that the config check imports, which must load
without torch (issue 19: a mistake is refused within seconds). A package's ``__getattr__``
(PEP 562) imports such a name only when something asks for it.
"""

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, sources: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: each name of ``sources`` comes from the
    submodule it maps to (relative, ``".interfaces"``) when first asked for."""

    def __getattr__(name: str) -> Any:
        if name not in sources:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(sources[name], package), name)

    return __getattr__
