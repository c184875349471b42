"""The one strict loader for Cadence's YAML: the server config, agents and deployments.

YAML only fills in frozen dataclasses. An unknown key, a missing required one, a wrong type,
or a value a section's own check refuses is a `ConfigError` that names the key's path:

    config.server.prot: unknown key; known: host, port, ...
    workers.llm.batching.max_bach: unknown key; known: max_batch, timeout_ms
    agent.system_prompt: required
    config.server.port: expected int, got 'eighty'
    workers.w.batching: timeout_ms must be in (0, 1000]

A section checks its own ranges in `__post_init__`, raising ValueError with a message
relative to the section; the loader adds the path. A required field (no default) may say
what it wants in its metadata: `field(metadata={"required": "one of a, b"})`.

At the bottom (in models/) so that both the agent server (agent/config.py, agents) and the
model plane (workers/deployment.py), which may not import agent/, load the same way.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from models.errors import ConfigError


def read_yaml(path: str | Path, what: str) -> Any:
    """The YAML document at `path` (None if it is empty); ConfigError if it cannot be read or parsed."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc}") from exc


def build_dataclass(cls: type, data: Any, where: str, *, given: Mapping[str, Any] | None = None) -> Any:
    """`cls` filled from the mapping `data`, each value checked against its field's type.
    `where` is the path of `data` ("" at the top of a file); `given` are fields the caller
    fills (a key of the same name in `data` is unknown)."""
    given = dict(given or {})
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    refuse_unknown(data, set(fields) - set(given), where)
    values = {name: coerce(hints[name], value, key_path(where, name)) for name, value in data.items()}
    for name, spec in fields.items():
        if name not in values and name not in given and _is_required(spec):
            wanted = spec.metadata.get("required")
            raise ConfigError(f"{key_path(where, name)}: required" + (f"; {wanted}" if wanted else ""))
    return construct(cls, {**given, **values}, where)


def construct(cls: type, values: dict[str, Any], where: str) -> Any:
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:  # ValueError: a section's own range check
        raise ConfigError(f"{where}: {exc}") from exc


def refuse_unknown(data: dict, known: set[str], where: str) -> None:
    unknown = [key for key in data if key not in known]
    if unknown:
        paths = ", ".join(key_path(where, str(key)) for key in unknown)
        noun = "unknown key" if len(unknown) == 1 else "unknown keys"
        raise ConfigError(f"{paths}: {noun}; known: {', '.join(sorted(known))}")


def key_path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def coerce(hint: Any, value: Any, where: str) -> Any:
    """The value as `hint` wants it, or a ConfigError naming `where`."""
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(hint, value, where)
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item_hint, _ellipsis) = typing.get_args(hint)
        return tuple(coerce(item_hint, v, f"{where}[{i}]") for i, v in enumerate(value))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint in (int, str, bool):
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: expected {hint.__name__}, got {value!r}")
        return value
    raise ConfigError(f"{where}: unsupported config type {hint}")


def _coerce_union(hint: Any, value: Any, where: str) -> Any:
    options = typing.get_args(hint)
    if value is None and type(None) in options:
        return None
    choices = [option for option in options if option is not type(None)]
    if len(choices) == 1:  # Optional[X]: X's own error names the deeper key
        return coerce(choices[0], value, where)
    for option in choices:
        try:
            return coerce(option, value, where)
        except ConfigError:
            continue
    raise ConfigError(f"{where}: {value!r} is not a {' or '.join(_name(option) for option in options)}")


def _is_required(spec: dataclasses.Field) -> bool:
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING


def _name(hint: Any) -> str:
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))
