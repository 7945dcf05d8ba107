"""The strict base of every config model, and the validation of one section by it.

Unknown keys and invalid values fail with the key's dotted path (see
:func:`validate_section`), never silently ignored.
"""

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

ConfigT = TypeVar("ConfigT", bound=BaseModel)


class StrictConfig(BaseModel):
    """Base of every config here: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def validate_section(
    model: type[ConfigT], raw: "ConfigT | Mapping[str, Any]", section: str
) -> ConfigT:
    """Validate ``raw`` (a mapping from YAML, or an instance) as ``model``.

    Raises a one-line ``ValueError`` that names each bad key as ``section.key.path``.
    """
    if isinstance(raw, model):
        return raw
    if isinstance(raw, BaseModel):
        raw = raw.model_dump()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{section}: expected a mapping of keys, got {type(raw).__name__}")
    try:
        return model.model_validate(dict(raw))
    except ValidationError as err:
        lines = []
        for error in err.errors():
            path = ".".join(str(part) for part in (section, *error["loc"]))
            named_value = error["loc"] and error["type"] != "missing"
            value = f" (got {error.get('input')!r})" if named_value else ""
            lines.append(f"{path}: {error['msg']}{value}")
        raise ValueError(f"invalid {section} config: " + "; ".join(lines)) from None
