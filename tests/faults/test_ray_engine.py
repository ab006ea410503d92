"""The data-parallel stages on a local two-node Ray cluster (`ray.cluster_utils.Cluster`, one
CPU a node): dense vectors equal to the local ones bit for bit, each worker loading its
encoder once; a node killed mid-stage, its shards rerun on the nodes left, same bytes; the
evaluate stage's results equal to the local ones question for question; an item that hangs or
that kills its worker fails the stage naming it (engine.item_timeout_s, engine.item_max_tries),
the other workers alive; no Ray process left after the cluster stops. Slow (a cluster start
costs ~10 s); CI runs it (.ci/run)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from ray.cluster_utils import Cluster  # noqa: E402

from searchrl.config import EngineConfig  # noqa: E402
from searchrl.eval.results import load_eval_result, read_question_results  # noqa: E402
from searchrl.ray_engine import EngineError, RayEngine, open_engine  # noqa: E402
from searchrl.retrieval.embedding import (  # noqa: E402
    EmbeddingCache,
    assemble,
    embed_corpus,
    plan_shards,
    rows_to_embed,
    run_shards_on,
    text_hashes,
)
from searchrl.sinks import NullSink  # noqa: E402
from searchrl.stages import evaluate_policy  # noqa: E402
from tests.helpers import save_tiny_policy  # noqa: E402
from tests.unit.test_embedding_shards import CONFIG, make_corpus, texts_of  # noqa: E402
from tests.unit.test_metrics_eval_run import (  # noqa: E402
    DOCS,
    _config,
    two_corpus_inputs,
)

# One torch thread in this process, as each Ray worker runs (`engine.worker_cpus=1`): on some
# CPUs float32 kernels round differently with another thread count (a CI machine: last-bit
# differences against this process's two threads; equal on this one), and what is compared
# here is the sharding and assembly, not the kernels.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
N = 240  # 10 shards of 24


def _ray_processes(session: str) -> list[str]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if session in cmdline:
            found.append(f"{proc.pid} {proc.info['name']}")
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Head + one worker node, one CPU each; the driver connected; stopped at the end with
    no raylet, GCS or worker process of its session left."""
    local = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    local.add_node(num_cpus=1)
    local.wait_for_nodes()
    session = Path(local.head_node.get_session_dir_path()).name
    ray.init(address=local.address, log_to_driver=False)
    try:
        yield local
    finally:
        ray.shutdown()
        local.shutdown()
    assert _ray_processes(session) == []


def _engine(cluster: Cluster, **more: Any) -> EngineConfig:
    return EngineConfig(**{"kind": "ray", "address": cluster.address, **more})


@pytest.fixture(scope="module")
def local_vectors(one_torch_thread: None, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The corpus embedded in this process, with one torch thread as the module's tests."""
    root = tmp_path_factory.mktemp("local")
    embed_corpus(texts_of(make_corpus(N)), EmbeddingCache(root / "cache", CONFIG), CONFIG,
                 root / "emb.npy", progress=False)
    return np.load(root / "emb.npy").tobytes()


def test_dense_shards_on_two_nodes_equal_local_bit_for_bit(
        cluster: Cluster, local_vectors: bytes, tmp_path: Path) -> None:
    with open_engine(_engine(cluster)) as engine:
        assert engine is not None
        report = embed_corpus(texts_of(make_corpus(N)), EmbeddingCache(tmp_path, CONFIG),
                              CONFIG, tmp_path / "emb.npy", progress=False, engine=engine)
        assert len(set(engine.worker_nodes())) == 2  # one worker a node
        assert engine.loads() == 2  # 10 shards, one encoder load per worker
    assert (report.shards_embedded, report.workers) == (10, 2)
    assert np.load(tmp_path / "emb.npy").tobytes() == local_vectors


class _KillAtPull:
    """The stage's shards, removing `node` (no grace) when shard `at` is pulled, and going on
    once the cluster has seen it die. At `at` = the number of workers, each was handed one shard
    (the doomed one's is in flight on the node that dies) and the next round, handed out in the
    same pass with no result taken in between, gives the dead worker another: its loss is met
    in the stage, whatever the machine's speed. (Killed at the first shard back, as before, it
    was not under load: the others had been handed every shard by then, and the doomed worker
    had finished its own.)"""

    def __init__(self, shards: Any, cluster: Cluster, node: Any, at: int) -> None:
        self.shards, self.cluster, self.node, self.at = shards, cluster, node, at

    def __iter__(self) -> Iterator[Any]:
        for pulled, shard in enumerate(self.shards):
            if pulled == self.at:
                self.cluster.remove_node(self.node, allow_graceful=False)
                deadline = time.monotonic() + 120
                while any(x["NodeID"] == self.node.node_id and x["Alive"]
                          for x in ray.nodes()):
                    assert time.monotonic() < deadline, "the removed node never died"
                    time.sleep(0.2)
            yield shard


class _Count:
    def __init__(self) -> None:
        self.count = 0

    def update(self, n: int) -> None:
        self.count += n


def test_a_node_killed_mid_stage_its_shards_rerun_on_the_nodes_left(
        cluster: Cluster, local_vectors: bytes, tmp_path: Path) -> None:
    doomed = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    rows = make_corpus(N)
    texts = [r["contents"] for r in rows]
    hashes = text_hashes(texts)
    cache = EmbeddingCache(tmp_path, CONFIG)
    cache.open()
    todo = rows_to_embed(hashes, np.zeros(len(hashes), bool))
    bar = _Count()
    with open_engine(_engine(cluster, workers=3)) as engine:
        assert engine is not None
        assert doomed.node_id in engine.worker_nodes()
        shards = _KillAtPull(plan_shards([texts], todo, hashes, CONFIG.encoder_shard_size),
                             cluster, doomed, at=3)  # 3 workers
        run_shards_on(engine, shards, CONFIG, cache, bar)  # type: ignore[arg-type]
        assert doomed.node_id not in engine.worker_nodes()
        assert len(engine.worker_nodes()) == 2  # the killed node's worker was dropped
    assert bar.count == N
    assemble(cache, hashes, tmp_path / "emb.npy")
    assert np.load(tmp_path / "emb.npy").tobytes() == local_vectors


def _alive(engine: RayEngine) -> int:
    """The engine's workers that answer (each within 30 s)."""
    return len(ray.get([actor.ready.remote() for actor in engine.workers()], timeout=30))


# The item functions below are defined in the tests: cloudpickle sends a nested function by
# value, so the workers need not import this module.


@pytest.mark.timeout(180)  # before the fix the stage waited on the hung worker forever
def test_an_item_that_hangs_fails_the_stage_naming_it_within_the_timeout(
        cluster: Cluster) -> None:
    def hang_on(state: Any, item: str) -> str:
        if item == "hang":
            time.sleep(3600)  # alive, never done: no worker is lost
        return item

    with open_engine(_engine(cluster, item_timeout_s=5.0)) as engine:
        assert engine is not None and _alive(engine) == 2  # started before the clock
        started = time.monotonic()
        with pytest.raises(EngineError, match=r"item 2 of .*hang_on \('hang'\) ran longer "
                                              r"than engine.item_timeout_s=5.0"):
            list(engine.map(hang_on, ["a", "b", "hang", "c"]))
        assert time.monotonic() - started < 5.0 + 10.0
        assert _alive(engine) == 1  # the hung worker was stopped, the other one answers


def test_an_item_that_kills_its_worker_fails_after_item_max_tries(cluster: Cluster) -> None:
    def crash_on(state: Any, item: str) -> str:
        if item == "poison":
            os._exit(1)  # as the OOM killer or a native crash would end the worker
        return item

    # Three workers on the two CPUs: two tries take two of them, the third is left.
    config = _engine(cluster, workers=3, worker_cpus=0.5, item_max_tries=2)
    with open_engine(config) as engine:
        assert engine is not None and _alive(engine) == 3
        with pytest.raises(EngineError, match=r"item 1 of .*crash_on \('poison'\): its worker "
                                              r"died running it 2 times "
                                              r"\(engine.item_max_tries=2\)"):
            list(engine.map(crash_on, ["a", "poison", "b", "c", "d", "e", "f"]))
        assert _alive(engine) == 1  # not retried on every worker until none is left


def _comparable(path: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.to_dict().items() if k != "latency_s"}
            for r in read_question_results(path)]


def test_evaluate_stage_on_ray_equals_local_per_question(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mapped: list[int] = []  # chunks each system and set sent to the workers
    plain_map = RayEngine.map

    def counting_map(self: RayEngine, fn: Any, items: Any) -> Any:
        listed = list(items)
        mapped.append(len(listed))
        return plain_map(self, fn, listed)

    monkeypatch.setattr(RayEngine, "map", counting_map)
    policy_dir = save_tiny_policy(DOCS.values(), tmp_path / "policy")
    base = _config()
    config = base.model_copy(update={
        "index": base.index.model_copy(update={"retriever": "bm25",
                                                "eval_all_retrievers": False}),
        "eval": base.eval.model_copy(update={"baselines": ("retrieve_once", "no_search")})})
    dataset, index, ckpt = two_corpus_inputs(tmp_path, config, policy_dir)
    results = {}
    for kind in ("local", "ray"):
        run = config.model_copy(update={
            "run": config.run.model_copy(update={"work_dir": tmp_path / kind}),
            "engine": _engine(cluster, kind=kind)})
        results[kind] = load_eval_result(evaluate_policy(run, dataset, index, ckpt,
                                                         NullSink()).results_path)
    local, remote = results["local"], results["ray"]
    # 3 systems on the 5 main questions and the 4 of the other set, in chunks of 2
    # (eval.batch_size), then the train audit (no train split here: nothing).
    assert mapped == [3, 3, 3, 2, 2, 2]
    assert set(remote.systems) == set(local.systems) == {"retrieve_once", "no_search",
                                                         "trained"}
    for name, system in local.systems.items():
        got, want = (_comparable(remote.systems[name].questions_path),
                     _comparable(system.questions_path))
        # Answers, EM, searches, tokens: equal. The answer's log-prob confidence is summed in
        # float32 by as many threads as the process has (1 a worker here): equal to rounding.
        diff = [(i, k, g[k], w[k]) for i, (g, w) in enumerate(zip(got, want, strict=True))
                for k in w if g[k] != (pytest.approx(w[k], rel=1e-6)
                                       if k == "confidence" and w[k] is not None else w[k])]
        assert not diff, (name, diff)
        assert remote.systems[name].summary.em == system.summary.em
    assert remote.deltas == local.deltas
    for name, system in local.extra_sets["other"].systems.items():
        got = dataclasses.replace(remote.extra_sets["other"].systems[name],
                                  latency_s=system.latency_s)
        assert repr(got) == repr(system), name  # repr: nan (no supporting ids) equals nan
