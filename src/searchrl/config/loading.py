"""Loading a YAML file with `key.sub=value` overrides into a validated `PipelineConfig`."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from searchrl.config.base import ConfigError
from searchrl.config.pipeline import PipelineConfig


def _parse_scalar(text: str) -> Any:
    return yaml.safe_load(text) if text != "" else ""


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `a.b.c=value` overrides (value parsed as YAML) to a nested dict, returning a copy."""
    result: dict[str, Any] = json.loads(json.dumps(data))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key.sub=value")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = result
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = _parse_scalar(value)
    return result


def _valid_keys_at(loc: tuple[int | str, ...]) -> list[str]:
    model: type[BaseModel] = PipelineConfig
    for part in loc[:-1]:
        field = next(
            (f for n, f in model.model_fields.items() if part in (n, f.alias)), None
        )
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return sorted(f.alias or n for n, f in model.model_fields.items())


def _format_errors(source: str, err: ValidationError) -> str:
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
        elif "expected" in e.get("ctx", {}):
            msg = f"{msg}"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path, overrides: list[str] | None = None) -> PipelineConfig:
    """Load a YAML file, apply overrides, validate; ConfigError names the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    data = apply_overrides(raw, overrides or [])
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_errors(str(path), exc)) from exc
