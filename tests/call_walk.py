"""The config's trip through the library's call graph, read from the source (docs/DESIGN.md,
"The train stage reads top down").

From a start function, walk every call that hands on the run's config (the `PipelineConfig`
or one of its sections), depth first in the order Python evaluates them (a call's arguments
before the call), expanding each call again where it recurs (a real trip, not a set of
edges) and stopping a recursion at a function already on the stack. Each call reached is an
event in the module that defines the callee. A call on the config itself
(`config.inputs_of(...)`) hands nothing on and is no event; neither is a class, a method of
an object other than a module, or anything outside `searchrl`.

Over the event sequence:
- a climb is an event whose module imports (directly or through others, lazily included) the
  previous event's module: the trip went back up a layer;
- a return is an event in a module other than the previous one's that the trip entered and
  left before;
- a visit of a module is a run of consecutive events in it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from searchrl.codehash import import_closure

PACKAGE = "searchrl"


@dataclass(frozen=True)
class Event:
    module: str
    function: str
    depth: int


def _post_order(node: ast.AST) -> Iterator[ast.AST]:
    """Nodes in evaluation order (children first); nested defs and lambdas are not entered:
    their bodies run when something calls them, not here."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        yield from _post_order(child)
    yield node


def _chain(node: ast.AST) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None for anything else."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _value(node: ast.AST, bound: dict[str, Any]) -> Any:
    """The config object an expression denotes (`config`, `config.train`, `cfg`), else None."""
    chain = _chain(node)
    if chain is None or chain[0] not in bound:
        return None
    obj = bound[chain[0]]
    for attr in chain[1:]:
        obj = getattr(obj, attr, None)
    return obj if isinstance(obj, BaseModel) else None


def _callee(func: ast.AST, fn: Callable[..., Any], bound: dict[str, Any]) -> Any:
    chain = _chain(func)
    if chain is None or chain[0] in bound:
        return None  # a computed callee, or a method of the config itself
    obj: Any = fn.__globals__.get(chain[0])  # type: ignore[attr-defined]
    if obj is None:
        return None
    for attr in chain[1:]:
        if not isinstance(obj, types.ModuleType):
            return None  # a method of an object: not resolvable from the source
        obj = getattr(obj, attr, None)
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if not inspect.isfunction(obj) or not obj.__module__.startswith(PACKAGE + "."):
        return None
    return obj


def _tree(fn: Callable[..., Any]) -> ast.FunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    node = ast.parse(source).body[0]
    return node if isinstance(node, ast.FunctionDef) else None


def walk(start: Callable[..., Any], config: BaseModel, limit: int = 400) -> list[Event]:
    """The first `limit` events of the config's trip from `start` (its first parameter is
    the config)."""
    events: list[Event] = []
    start = inspect.unwrap(start)
    first = next(iter(inspect.signature(start).parameters))

    def visit(fn: Callable[..., Any], bound: dict[str, Any], stack: tuple[Any, ...]) -> None:
        tree = _tree(fn)
        if tree is None:
            return
        bound = dict(bound)
        for node in _post_order(tree):
            if len(events) >= limit:
                return
            # `cfg = config.train.sft`: the alias carries the config on
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name)
                    and _value(node.value, bound) is not None):
                bound[node.targets[0].id] = _value(node.value, bound)
                continue
            if not isinstance(node, ast.Call):
                continue
            callee = _callee(node.func, fn, bound)
            if callee is None:
                continue
            try:
                sig = inspect.signature(callee)
                args = sig.bind_partial(*[_value(a, bound) for a in node.args
                                          if not isinstance(a, ast.Starred)],
                                        **{k.arg: _value(k.value, bound)
                                           for k in node.keywords if k.arg is not None})
            except TypeError:
                continue
            handed = {name: v for name, v in args.arguments.items()
                      if isinstance(v, BaseModel)}
            if not handed:
                continue
            events.append(Event(callee.__module__, callee.__qualname__, len(stack)))
            if callee not in stack:
                visit(callee, handed, (*stack, callee))

    events.append(Event(start.__module__, start.__qualname__, 0))
    visit(start, {first: config}, (start,))
    return events[:limit]


@dataclass(frozen=True)
class Figures:
    events: int
    climbs: int
    returns: int
    visits: dict[str, int]


def figures(events: list[Event]) -> Figures:
    """Climbs, returns and visits per module over `events` (module docstring)."""
    closure: dict[str, set[str]] = {}

    def below(module: str) -> set[str]:
        if module not in closure:
            closure[module] = set(import_closure([module])) - {module}
        return closure[module]

    climbs = returns = 0
    visits: dict[str, int] = {}
    left: set[str] = set()
    previous: str | None = None
    for event in events:
        module = event.module
        if module != previous:
            visits[module] = visits.get(module, 0) + 1
            if previous is not None:
                left.add(previous)
                climbs += previous in below(module) and module not in below(previous)
                returns += module in left
        previous = module
    return Figures(len(events), climbs, returns, visits)
