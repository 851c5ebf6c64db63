"""Type checks for settings read from a JSON or YAML file a person may have edited (``site.json``): a wrong
type is a one-line ConfigError naming the file and the field, never a TypeError deep inside."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from silofl.core.errors import ConfigError

_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "float": (int, float),
    "int": (int,),
    "bool": (bool,),
    "None": (type(None),),
}


def _matches(value: Any, annotation: str) -> bool:
    for name in (part.strip() for part in annotation.split("|")):
        allowed = _TYPES.get(name)
        if allowed is None:  # a type this check does not know: left to the dataclass
            return True
        if isinstance(value, bool) and bool not in allowed:
            continue
        if isinstance(value, allowed):
            return not (isinstance(value, float) and math.isnan(value))
    return False


def check_field_types(obj: Any, where: str) -> None:
    """Raise ConfigError unless every field of the dataclass ``obj`` holds a value of its annotated type
    (``str``, ``float`` (an int is a float; a bool is neither; NaN is refused), ``int``, ``bool``, unions with
    ``None``)."""
    for f in fields(obj):
        annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        v = getattr(obj, f.name)
        if not _matches(v, annotation):
            raise ConfigError(
                f"{where}: {f.name} must be {annotation.replace(' | None', ' or null')}, got {v!r}"
            )
