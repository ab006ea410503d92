"""`key.sub=value` overrides from a command line, checked word by word before any is applied.

A mistake here costs a user a run, so each one is refused with the key, what was given, what
the key expects and how to quote it: an unknown key, an empty value, a value that is not YAML,
and a value the shell split into several words (`hop_mix={1: 0.2, 2: 0.8}` typed unquoted
reaches argv as `hop_mix={1:`, `0.2,`, `2:`, `0.8}`).
"""

from __future__ import annotations

import difflib
import re
import shlex
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from searchrl.config.base import ConfigError


@dataclass(frozen=True)
class Override:
    key: str  # dotted, as typed
    text: str  # the value as typed
    value: Any  # the value parsed as YAML
    field: FieldInfo | None  # the field it sets (None: a key inside a mapping field)

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))

    def quoted(self, text: str | None = None) -> str:
        """The override as one shell word: `key='value'`."""
        return f"{self.key}={shlex.quote(self.text if text is None else text)}"

    def expected(self) -> str:
        return expected_of(self.field) if self.field is not None else "a value for this key"

    def example(self) -> str:
        """`key=<default>` quoted for the shell, else the override itself quoted."""
        return self.quoted(_example_text(self.field) or self.text)


def parse_overrides(root: type[BaseModel], items: Sequence[str]) -> list[Override]:
    """Each `key.sub=value` word of `items` checked against `root`'s fields and parsed as YAML;
    ConfigError for the first one that is not usable."""
    overrides: list[Override] = []
    for index, item in enumerate(items):
        if "=" not in item:  # (stray words after an override are reported with it, below)
            raise ConfigError(f"override {item!r}: expected key.sub=value as one word, with no "
                              "spaces around '=' (e.g. train.steps=10)")
        key, text = item.split("=", 1)
        key = key.strip()
        strays = _words_after(items, index)
        field = _field_for(root, key, item)
        given = Override(key, text, None, field)
        if strays:
            raise ConfigError(_shell_split_message(given, strays))
        if text.strip() == "":
            raise ConfigError(
                f"override {key}=: empty value; expected {given.expected()}. Write a null "
                f"value as {key}=null, an empty string as {key}=\"''\"")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            expected = given.expected()
            as_text = (f"; text with YAML characters goes in YAML quotes inside the shell's: "
                       f"{key}=\"'{text}'\"" if "str" in expected else "")
            raise ConfigError(
                f"override {key}: {text!r} is not a YAML value ({where}); expected {expected}. "
                "Quote a value with spaces, braces or brackets as one word, e.g. "
                f"{given.example()}{as_text}") from None
        overrides.append(Override(key, text, value, field))
    return overrides


def expected_of(field: FieldInfo) -> str:
    """What a field takes, as a user reads it: its type and, when it has one, its default."""
    wanted = re.sub(r"\b[A-Za-z_]\w*\.", "", str(_type_name(field.annotation)))
    example = _example_text(field)
    return f"{wanted} (default: {example})" if example is not None else wanted


def _type_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def _example_text(field: FieldInfo | None) -> str | None:
    """The field's default as YAML flow text (None: no default, or a whole section)."""
    if field is None:
        return None
    default = field.get_default(call_default_factory=True)
    if default is PydanticUndefined or isinstance(default, BaseModel):
        return None
    text: str = yaml.safe_dump(_plain(default), default_flow_style=True, width=10**6)
    return text.strip().removesuffix("...").strip()


def _plain(value: Any) -> Any:
    """`value` as YAML writes it back readably (mapping keys keep their type: {1: 0.3})."""
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return to_jsonable_python(value)


def _words_after(items: Sequence[str], index: int) -> list[str]:
    strays: list[str] = []
    for item in items[index + 1:]:
        if "=" in item:
            break
        strays.append(item)
    return strays


def _unbalanced(text: str) -> bool:
    return text.count("{") + text.count("[") > text.count("}") + text.count("]")


def _shell_split_message(given: Override, strays: list[str]) -> str:
    whole = " ".join([given.text, *strays])
    words = ", ".join(repr(w) for w in strays)
    if _unbalanced(given.text):
        return (f"override {given.key}={given.text} looks shell-split: quote the whole value, "
                f"{given.quoted(whole)} (the words after it, {words}, are the rest of its "
                f"value; expected {given.expected()})")
    return (f"override {given.key}={given.text}: then {words}, not key.sub=value; if "
            f"{'they belong' if len(strays) > 1 else 'it belongs'} to the value of "
            f"{given.key}, quote the whole value: {given.quoted(whole)}")


def _field_for(root: type[BaseModel], key: str, item: str) -> FieldInfo | None:
    """The field `key` sets; ConfigError naming the valid keys where it leaves the model."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"override {item!r}: the key {key!r} has an empty part; expected "
                          "key.sub=value (e.g. train.steps=10)")
    model = root
    for depth, part in enumerate(parts):
        fields = {(info.alias or name): info for name, info in model.model_fields.items()}
        where = ".".join(parts[:depth]) or "the top level"
        field = fields.get(part)
        if field is None:
            close = difflib.get_close_matches(part, list(fields), n=1)
            hint = f" (did you mean {'.'.join([*parts[:depth], close[0]])!r}?)" if close else ""
            raise ConfigError(f"override {item!r}: unknown key {'.'.join(parts[:depth + 1])!r}"
                              f"{hint}; valid keys under {where}: {', '.join(sorted(fields))}")
        if depth == len(parts) - 1:
            return field
        section = section_of(field.annotation)
        if section is None:
            if _is_mapping(field.annotation):
                return None  # a key inside a mapping: the model checks it with the rest
            raise ConfigError(f"override {item!r}: {'.'.join(parts[:depth + 1])} is a value "
                              f"({expected_of(field)}), not a section with keys under it")
        model = section
    raise AssertionError("unreachable: the loop returns at the last part")


def _members(annotation: Any) -> tuple[Any, ...]:
    if get_origin(annotation) in (Union, types.UnionType):
        return get_args(annotation)
    return (annotation,)


def section_of(annotation: Any) -> type[BaseModel] | None:
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member
    return None


def _is_mapping(annotation: Any) -> bool:
    return any(isinstance(origin, type) and issubclass(origin, Mapping)
               for origin in map(get_origin, _members(annotation)))
