"""Where a stage's data-parallel work runs: in its own process, or on Ray actors.

`open_engine(config.engine)` gives a stage `None` (`engine.kind: local`: the stage runs its
work as it always has) or a `RayEngine` connected to the cluster at `engine.address`. A
stage hands the engine a module-level function `fn(state, item)` and its items; `map` runs
them on a fixed set of Ray actors (the workers) and yields the results in item order. The
`WorkerState` an actor keeps between items holds one object per slot (one encoder, one
policy, one searcher), loaded on first use and replaced only when the item asks for another
one, so a worker loads its model once per stage, not once per item.

Why actors inside a stage, not Prefect's RayTaskRunner: the unit of caching, tracking and
resuming stays the stage (one Prefect task, one MLflow run, one `ref.json`); the units
fanned out (embedding shards, evaluation chunks) are thousands of small pure functions that
need a loaded model, which stateless tasks would reload each time, and the library never
imports Prefect.

Faults: a worker whose actor or node dies mid-item is dropped and its items run again on
the workers left (each item is a pure function of its inputs, so the bytes are the same); a
stage with no worker left, or a cluster unreachable at start or lost mid-stage, fails with
`EngineError` naming the address (exit code 7). So does an item that runs longer than
`engine.item_timeout_s` (a worker hung but alive is never lost: its worker is stopped) or
whose worker died running it `engine.item_max_tries` times (an item that kills any worker it
runs on would otherwise take down every one); both messages name the item. What finished
before (embedding shards in the content-hash cache) is reused by the rerun.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import reprlib
import socket
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from searchrl.config.base import ConfigError
from searchrl.config.engine import EngineConfig

T = TypeVar("T")
R = TypeVar("R")
# Items queued per worker: enough to keep it busy while a result travels back, few enough
# that a streamed input (a corpus's shards) is never held whole.
IN_FLIGHT_PER_WORKER = 2
# How often a wait with nothing finished checks that the cluster is still there.
LIVENESS_POLL_S = 5.0
# How long the results of a dead worker's other items may take to arrive (they fail at once).
SETTLE_S = 10.0

# An item in an error message: its repr, cut short (items carry configs and passage texts).
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxtuple = _SHORT.maxlist = 4


def _lost_worker_errors() -> tuple[type[BaseException], ...]:
    from ray import exceptions as rex

    return (rex.RayActorError, rex.WorkerCrashedError, rex.NodeDiedError, rex.ObjectLostError)


class EngineError(RuntimeError):
    """The Ray cluster is unreachable, was lost, or has no worker left, or an item hung or
    killed its workers (exit code 7)."""


@dataclass
class _Flight:
    """An item handed to a worker. A worker runs its items one at a time, in the order they
    were handed to it: the first of its flights is the one running."""

    actor: Any
    index: int
    item: Any
    order: int  # handed out as the order-th
    started: float | None = None  # when it began to run (monotonic): its turn came


class WorkerState:
    """What one worker keeps between items: at most one object per slot."""

    def __init__(self) -> None:
        self._slots: dict[str, tuple[Hashable, Any]] = {}
        self.loads = 0  # objects loaded so far (a test's evidence of once per worker)

    def get(self, slot: str, key: Hashable, load: Callable[[], Any]) -> Any:
        """The object in `slot` when it was loaded for `key`, else `load()` replacing it."""
        held = self._slots.get(slot)
        if held is not None and held[0] == key:
            return held[1]
        self._slots.pop(slot, None)  # free the old one before loading the new one
        value = load()
        self._slots[slot] = (key, value)
        self.loads += 1
        return value


class _Worker:
    """The actor: runs items with its state."""

    def __init__(self, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self.state = WorkerState()

    def ready(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def run(self, fn: Callable[[WorkerState, Any], Any], item: Any) -> Any:
        return fn(self.state, item)

    def loads(self) -> int:
        return self.state.loads


def _check_reachable(address: str, timeout_s: float) -> None:
    """A TCP connect to host:port before Ray tries (Ray waits a minute on a wrong address)."""
    host, port = address.removeprefix("ray://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise EngineError(f"engine.address={address}: Ray cluster unreachable ({exc}); start "
                          "it (`ray start --head`, README operations) or set engine.kind=local"
                          ) from exc


class RayEngine:
    """Workers on a Ray cluster; see the module docstring."""

    def __init__(self, config: EngineConfig) -> None:
        import ray

        self.config = config
        self.address = config.address
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            self._connect()
        self.address = ray.get_runtime_context().gcs_address if config.address in (
            "auto", "local") else config.address
        self._actors: list[Any] = []
        self._nodes: dict[Any, str] = {}

    def _connect(self) -> None:
        import ray

        config = self.config
        if config.address not in ("auto", "local"):
            _check_reachable(config.address, config.connect_timeout_s)
        elif config.address == "auto" and os.environ.get("RAY_ADDRESS", "").count(":"):
            _check_reachable(os.environ["RAY_ADDRESS"], config.connect_timeout_s)
        try:
            ray.init(address=None if config.address == "local" else config.address,
                     logging_level=logging.WARNING, log_to_driver=False, include_dashboard=False)
        except (ConnectionError, TimeoutError, RuntimeError) as exc:
            raise EngineError(f"engine.address={config.address}: cannot connect to a Ray "
                              f"cluster: {exc}") from exc

    # --- workers

    def workers(self) -> list[Any]:
        """The actors, started on first use: `engine.workers` of them, or as many as the
        cluster's resources fit, spread over its nodes."""
        if self._actors:
            return self._actors
        import ray

        config = self.config
        total = self._call(ray.cluster_resources)
        fit = total.get("CPU", 0.0) / config.worker_cpus
        if config.worker_gpus:
            fit = min(fit, total.get("GPU", 0.0) / config.worker_gpus)
        count = config.workers or math.floor(fit)
        if count < 1 or count > math.floor(fit + 1e-9):
            raise EngineError(f"Ray cluster at {self.address} has {total.get('CPU', 0)} CPUs, "
                              f"{total.get('GPU', 0)} GPUs: room for {math.floor(fit)} "
                              f"workers of {config.worker_cpus} CPU / {config.worker_gpus} "
                              f"GPU, engine.workers={config.workers} asked for {count}")
        remote: Any = ray.remote(_Worker).options(
            num_cpus=config.worker_cpus, num_gpus=config.worker_gpus, max_restarts=0,
            scheduling_strategy="SPREAD")
        threads = max(1, int(config.worker_cpus))
        actors: list[Any] = [remote.remote(threads) for _ in range(count)]
        ready = {actor.ready.remote(): actor for actor in actors}
        done, pending = self._call(ray.wait, list(ready), num_returns=len(ready),
                                   timeout=config.worker_start_timeout_s)
        if pending:
            for actor in actors:
                ray.kill(actor)
            raise EngineError(f"Ray cluster at {self.address}: {len(pending)} of {count} "
                              "workers did not start within engine.worker_start_timeout_s="
                              f"{config.worker_start_timeout_s}")
        for ref in done:  # a worker placed on a node that died meanwhile: go on without it
            try:
                self._nodes[ready[ref]] = ray.get(ref)
            except _lost_worker_errors():
                ray.kill(ready[ref])
        self._actors = [a for a in actors if a in self._nodes]
        if not self._actors:
            raise EngineError(f"Ray cluster at {self.address}: every worker died starting")
        return self._actors

    def worker_nodes(self) -> list[str]:
        """The node id of each live worker."""
        return [self._nodes[a] for a in self.workers()]

    def loads(self) -> int:
        """Objects loaded by the live workers so far (models, searchers)."""
        import ray

        return sum(self._call(ray.get, [a.loads.remote() for a in self.workers()]))

    def _drop(self, actor: Any) -> None:
        import ray

        if actor in self._actors:
            self._actors.remove(actor)
            with contextlib.suppress(Exception):
                ray.kill(actor)

    def _call(self, fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """A call to the cluster, its connection errors as EngineError."""
        try:
            return fn(*args, **kwargs)
        except (ConnectionError, TimeoutError) as exc:
            raise self._lost(exc) from exc

    def _lost(self, exc: BaseException) -> EngineError:
        return EngineError(f"lost the Ray cluster at {self.address} mid-stage ({exc}); rerun "
                           "the stage when it is back: finished work is reused")

    # --- running items

    def map(self, fn: Callable[[WorkerState, T], R], items: Iterable[T]) -> Iterator[R]:
        """`fn(state, item)` for every item on the workers, results in item order. An item
        whose worker died runs again on another, up to `engine.item_max_tries` times; one
        running longer than `engine.item_timeout_s` fails the stage; `fn`'s own errors are
        raised as they are."""
        import ray

        config = self.config
        source = enumerate(items)
        retry: deque[tuple[int, T]] = deque()
        flying: dict[Any, _Flight] = {}  # in the order handed out
        done: dict[int, R] = {}
        tries: dict[int, int] = {}  # index -> workers that died running it
        handed = itertools.count()
        next_out = 0
        exhausted = False

        def name(flight: _Flight) -> str:
            what = getattr(fn, "__qualname__", repr(fn))
            return f"item {flight.index} of {what} ({_SHORT.repr(flight.item)})"

        def submit() -> None:
            nonlocal exhausted
            while True:
                actors = self.workers()
                if len(flying) >= IN_FLIGHT_PER_WORKER * len(actors):
                    return
                if retry:
                    index, item = retry.popleft()
                elif exhausted:
                    return
                else:
                    got = next(source, None)
                    if got is None:
                        exhausted = True
                        return
                    index, item = got
                load = {a: 0 for a in actors}
                for flight in flying.values():
                    if flight.actor in load:
                        load[flight.actor] += 1
                actor = min(actors, key=load.__getitem__)
                flying[actor.run.remote(fn, item)] = _Flight(actor, index, item, next(handed))

        def running() -> list[tuple[_Flight, float]]:
            """Each worker's first flight and when it started: when its turn was seen."""
            heads: dict[Any, _Flight] = {}
            for flight in flying.values():
                heads.setdefault(flight.actor, flight)
            now = time.monotonic()
            out = []
            for flight in heads.values():
                if flight.started is None:
                    flight.started = now
                out.append((flight, flight.started))
            return out

        def lost(flight: _Flight) -> None:
            """`flight`'s worker died: its other flights settle (results kept, the rest
            queued again, first the one it was running), which is charged with a try."""
            self._drop(flight.actor)
            others = {ref: f for ref, f in flying.items() if f.actor is flight.actor}
            settled: list[Any] = []
            if others:
                settled, _ = self._call(ray.wait, list(others), num_returns=len(others),
                                        timeout=SETTLE_S)
            casualties = [flight]
            for ref, other in others.items():
                del flying[ref]
                if ref in settled:
                    try:
                        done[other.index] = self._result(ref)
                        continue
                    except _lost_worker_errors():
                        pass
                casualties.append(other)
            # The one it was running: the first handed out whose result is not in (a worker
            # runs its items in the order handed out). A node lost charges it too: rare.
            culprit = min(casualties, key=lambda f: f.order)
            tries[culprit.index] = tries.get(culprit.index, 0) + 1
            if tries[culprit.index] >= config.item_max_tries:
                raise EngineError(
                    f"{name(culprit)}: its worker died running it {tries[culprit.index]} "
                    f"times (engine.item_max_tries={config.item_max_tries}), on the Ray "
                    f"cluster at {self.address}: out of memory or a native crash in it. Run "
                    "the stage with engine.kind=local to see its error, or give a worker more "
                    "memory (engine.worker_cpus, or a smaller shard or batch)")
            if not self._actors:
                raise EngineError(f"Ray cluster at {self.address}: every worker was lost; "
                                  "rerun the stage: finished work is reused")
            retry.extendleft(sorted(((f.index, f.item) for f in casualties), reverse=True))

        def overdue() -> _Flight | None:
            """The first running flight past engine.item_timeout_s whose result is not in
            (one may have finished while the caller held a result)."""
            now = time.monotonic()
            late = {ref: f for ref, f in flying.items()
                    if f.started is not None and now - f.started > config.item_timeout_s}
            if not late:
                return None
            finished, _ = self._call(ray.wait, list(late), num_returns=len(late), timeout=0)
            hung = [f for ref, f in late.items() if ref not in finished]
            return min(hung, key=lambda f: f.order) if hung else None

        submit()
        while flying:
            heads = running()
            hung = overdue()
            if hung is not None:
                self._drop(hung.actor)
                raise EngineError(
                    f"{name(hung)} ran longer than engine.item_timeout_s="
                    f"{config.item_timeout_s} s on the Ray cluster at {self.address}; its "
                    "worker was stopped. Raise engine.item_timeout_s if the item is only slow, "
                    "else run the stage with engine.kind=local to see where it hangs")
            first_due = min(started for _, started in heads) + config.item_timeout_s
            wait_s = min(LIVENESS_POLL_S, max(first_due - time.monotonic(), 0.0) + 0.01)
            ready, _ = self._call(ray.wait, list(flying), num_returns=1, timeout=wait_s)
            if not ready:
                self._call(ray.nodes)  # raises when the cluster itself is gone
                continue
            for ref in ready:
                if ref not in flying:  # settled with a lost worker's others
                    continue
                flight = flying.pop(ref)
                try:
                    done[flight.index] = self._result(ref)
                except _lost_worker_errors():
                    lost(flight)
            submit()
            while next_out in done:
                yield done.pop(next_out)
                next_out += 1

    def _result(self, ref: Any) -> Any:
        """A finished item's value; `fn`'s own error raised as it is."""
        import ray
        from ray import exceptions as rex

        try:
            return ray.get(ref)
        except _lost_worker_errors():
            raise
        except rex.RayTaskError as exc:
            raise exc.cause from exc
        except rex.RaySystemError as exc:
            raise self._lost(exc) from exc

    def close(self) -> None:
        """Stop the workers; leave the cluster (stopping it when this engine started it)."""
        import ray

        for actor in list(self._actors):
            self._drop(actor)
        if self._owns_ray:
            ray.shutdown()


@contextlib.contextmanager
def open_engine(config: EngineConfig) -> Iterator[RayEngine | None]:
    """The stage's engine: None for `local`, else a connected `RayEngine`, closed on exit."""
    if config.kind == "local":
        yield None
        return
    try:
        import ray  # noqa: F401
    except ImportError as exc:
        raise ConfigError("engine.kind=ray needs Ray: pip install -e '.[ray]' (or "
                          "engine.kind=local)") from exc
    engine = RayEngine(config)
    try:
        yield engine
    finally:
        engine.close()
