"""Loading a YAML file with `key.sub=value` overrides into a validated `PipelineConfig`."""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from searchrl.config.base import ConfigError
from searchrl.config.overrides import Override, parse_overrides, section_of
from searchrl.config.pipeline import PipelineConfig


def apply_overrides(data: dict[str, Any], overrides: Sequence[Override]) -> dict[str, Any]:
    """A copy of the nested dict `data` with each override's value set at its dotted key."""
    result: dict[str, Any] = json.loads(json.dumps(data))
    for override in overrides:
        node = result
        for part in override.parts[:-1]:
            child = node.get(part)
            if child is None:  # absent, or `null` in the file (e.g. eval.frontier)
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {override.key}: {part!r} holds {child!r} in the "
                                  "config file, not a section to set keys in")
            node = child
        node[override.parts[-1]] = override.value
    return result


def _valid_keys_at(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = PipelineConfig
    for part in loc[:-1]:
        field = next(
            (f for n, f in model.model_fields.items() if part in (n, f.alias)), None
        )
        section = section_of(field.annotation) if field else None
        if section is None:
            return []
        model = section
    return sorted(f.alias or n for n, f in model.model_fields.items())


def _override_for(loc: tuple[int | str, ...],
                  overrides: Sequence[Override]) -> Override | None:
    """The last override that set `loc` or a value inside it (a section's own check), if any."""
    path = tuple(str(p) for p in loc)
    found = None
    for override in overrides:
        n = min(len(path), len(override.parts))
        if path[:n] == override.parts[:n]:
            found = override
    return found


def _format_errors(source: str, err: ValidationError, overrides: Sequence[Override]) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        loc = tuple(e["loc"])
        key = ".".join(str(p) for p in loc) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            options = _valid_keys_at(loc)
            close = difflib.get_close_matches(str(loc[-1]), options, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            msg = f"unknown key{hint}; valid keys here: {', '.join(options)}"
        elif e["type"] != "value_error" and not isinstance(e.get("input"), dict | list):
            msg = f"{msg} (got {e.get('input')!r})"  # (a value error's message names it)
        override = _override_for(loc, overrides)
        if override is not None:
            msg += (f"\n    from the override {override.key}={override.text}; expected "
                    f"{override.expected()}, e.g. {override.example()}")
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path, overrides: Sequence[str] | None = None) -> PipelineConfig:
    """Load a YAML file, apply `key.sub=value` overrides, validate; ConfigError names the file,
    the key, what was given and what is expected."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    checked = parse_overrides(PipelineConfig, overrides or [])
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as UTF-8 text: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    data = apply_overrides(raw, checked)
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        source = f"{path} with overrides" if checked else str(path)
        raise ConfigError(_format_errors(source, exc, checked)) from None
