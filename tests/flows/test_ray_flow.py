"""The pipeline flow (flows/pipeline.py, a real Prefect run) with `engine.kind=ray` on a local
two-node Ray cluster (`ray.cluster_utils.Cluster`, one CPU a node), against the same flow with
`engine.kind=local` in another work dir: dense vectors of every corpus byte for byte equal,
evaluation equal per question for every system and set, the same decision; a local run on the
Ray run's work dir reruns no stage (the engine is in no cache key); the stages connect and
leave the cluster themselves, and no Ray process is left once it stops. Slow (a cluster and two
pipelines); CI runs it (.ci/run). Stage-level Ray tests: tests/faults/test_ray_engine.py.

Fast (default run): the cluster unreachable at start fails the flow at build_index with the
address in the message and exit code 7; the stage before it is reused by the rerun."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("psutil")

from ray.cluster_utils import Cluster  # noqa: E402

from flows.pipeline import main, pipeline  # noqa: E402
from searchrl.eval.results import EvalResult, load_eval_result  # noqa: E402
from searchrl.paths import StagePaths  # noqa: E402
from searchrl.ray_engine import RayEngine  # noqa: E402
from searchrl.tracking import child_runs  # noqa: E402
from tests.faults.test_ray_engine import _comparable, _ray_processes  # noqa: E402
from tests.flows.test_pipeline_flow import FAST, STAGES  # noqa: E402

# FAST with every search dense; small embedding shards and evaluation chunks, so both nodes'
# workers take some of each.
DENSE = [*FAST, "index.retriever=dense", "index.encoder_shard_size=64", "eval.batch_size=2",
         "eval.baselines=[no_search,retrieve_once]"]


def _workspace(root: Path) -> list[str]:
    return [f"run.work_dir={root / 'work'}",
            f"tracking.tracking_uri=sqlite:///{root / 'mlflow.db'}"]


def test_cluster_unreachable_at_start_fails_the_flow_naming_the_address(
        prefect_harness: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*FAST, "data.extra_eval={}", "data.extra_corpus={}", *_workspace(tmp_path),
            "engine.kind=ray", "engine.address=127.0.0.1:9",
            "engine.connect_timeout_s=2"]
    validated = StagePaths(tmp_path / "work").validate_dir / "ref.json"
    for attempt in range(2):
        capsys.readouterr()
        started = time.perf_counter()
        assert main(["--config", "configs/tiny.yaml", *argv]) == 7
        err = capsys.readouterr().err
        assert "engine.address=127.0.0.1:9: Ray cluster unreachable" in err, err
        assert "Traceback" not in err, err
        assert not (StagePaths(tmp_path / "work").index_dir / "ref.json").exists()
        if attempt == 0:
            first_validation = validated.stat().st_mtime_ns
        else:  # the rerun took the validated data from the cache and failed at once
            assert validated.stat().st_mtime_ns == first_validation
            assert time.perf_counter() - started < 30


# --- the whole flow on a two-node cluster (slow)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Head + one worker node, one CPU each. The test process does not connect: each stage
    does, at `engine.address`. Stopped at the end with no process of its session left."""
    local = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    local.add_node(num_cpus=1)
    local.wait_for_nodes()
    session = Path(local.head_node.get_session_dir_path()).name
    try:
        yield local
    finally:
        local.shutdown()
    assert _ray_processes(session) == []


@pytest.fixture(scope="module")
def runs(prefect_harness: None, one_torch_thread: None, cluster: Cluster,
         tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The flow run locally, then on the cluster in a work dir of its own; what the Ray
    engine ran (function, items, the nodes of its workers). Both in-process with one torch
    thread, as each Ray worker (`engine.worker_cpus=1`): on some CPUs float32 kernels round
    differently with another thread count, and the flows are compared byte for byte."""
    ran: list[tuple[str, int, frozenset[str]]] = []
    plain_map = RayEngine.map

    def recording_map(self: RayEngine, fn: Any, items: Iterable[Any]) -> Iterator[Any]:
        listed = list(items)
        yield from plain_map(self, fn, listed)
        ran.append((fn.__name__, len(listed), frozenset(self.worker_nodes())))

    roots = {kind: tmp_path_factory.mktemp(kind) for kind in ("local", "ray")}
    engines = {"local": ["engine.kind=local"],
               "ray": ["engine.kind=ray", f"engine.address={cluster.address}"]}
    results: dict[str, Any] = {"ran": ran, "roots": roots}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RayEngine, "map", recording_map)
        for kind, root in roots.items():
            started = time.perf_counter()
            results[kind] = pipeline(config_path="configs/tiny.yaml",
                                     overrides=[*DENSE, *_workspace(root), *engines[kind]])
            results[f"{kind}_s"] = time.perf_counter() - started
    return results


def _vectors(index_dir: str) -> dict[str, bytes]:
    return {str(p.relative_to(index_dir)): p.read_bytes()
            for p in sorted(Path(index_dir).glob("*/embeddings/embeddings.npy"))}


@pytest.mark.slow
def test_both_flows_ran_every_stage_and_the_ray_one_used_both_nodes(
        runs: dict[str, Any], cluster: Cluster) -> None:
    for kind in ("local", "ray"):
        result = runs[kind]
        stages = child_runs(result["tracking_uri"], result["parent_run_id"])
        assert {c["stage"] for c in stages} == STAGES, kind
        assert all(c["status"] == "FINISHED" for c in stages), kind
    nodes = frozenset(n.node_id for n in cluster.list_all_nodes())
    functions = {name for name, _, _ in runs["ran"]}
    assert functions == {"_embed_on_worker", "_rollouts_on_worker"}
    for name, items, workers_on in runs["ran"]:
        assert items >= 1 and workers_on == nodes, (name, items)  # a worker a node, both live
    assert sum(items for name, items, _ in runs["ran"] if name == "_embed_on_worker") >= 2
    assert not ray.is_initialized()  # each stage left the cluster it connected to


@pytest.mark.slow
def test_dense_vectors_through_the_flow_on_ray_equal_local_byte_for_byte(
        runs: dict[str, Any]) -> None:
    local, remote = (_vectors(runs[k]["index"].index_dir) for k in ("local", "ray"))
    assert set(local) == set(remote) == {"main/embeddings/embeddings.npy",
                                         "hotpotqa/embeddings/embeddings.npy"}
    for name, data in local.items():
        assert remote[name] == data, name
    assert runs["ray"]["index"].fingerprint == runs["local"]["index"].fingerprint


def _same_per_question(got: EvalResult, want: EvalResult) -> None:
    """Every system's answers, EM, F1, searches, tokens equal question for question; the
    answer's log-prob confidence to float32 rounding (summed by as many threads as the
    process has: 1 a Ray worker here)."""
    assert set(got.systems) == set(want.systems), want.eval_set
    for name, system in want.systems.items():
        expected = [{**row, "confidence": pytest.approx(row["confidence"], rel=1e-6)}
                    if row.get("confidence") is not None else row
                    for row in _comparable(system.questions_path)]
        assert _comparable(got.systems[name].questions_path) == expected, (want.eval_set, name)
        assert got.systems[name].summary.em == system.summary.em, (want.eval_set, name)
    assert got.deltas == want.deltas, want.eval_set


@pytest.mark.slow
def test_evaluation_through_the_flow_on_ray_equals_local_per_question(
        runs: dict[str, Any]) -> None:
    local, remote = (load_eval_result(runs[k]["evaluation"].results_path)
                     for k in ("local", "ray"))
    assert set(local.systems) >= {"trained", "no_search", "retrieve_once"}
    _same_per_question(remote, local)
    assert set(remote.extra_sets) == set(local.extra_sets) == {"hotpotqa"}
    for name, one in local.extra_sets.items():
        _same_per_question(load_eval_result(remote.extra_sets[name].results_path),
                           load_eval_result(one.results_path))
    decisions = [runs[k]["decision"] for k in ("local", "ray")]
    assert decisions[0].go == decisions[1].go
    assert decisions[0].reasons == decisions[1].reasons


@pytest.mark.slow
def test_a_local_run_after_the_ray_run_reruns_no_stage(runs: dict[str, Any]) -> None:
    again = pipeline(config_path="configs/tiny.yaml",
                     overrides=[*DENSE, *_workspace(runs["roots"]["ray"]), "engine.kind=local",
                                "engine.workers=5"])
    assert child_runs(again["tracking_uri"], again["parent_run_id"]) == []
    for key in ("dataset", "index", "curriculum", "checkpoint", "evaluation", "decision"):
        assert repr(again[key]) == repr(runs["ray"][key]), key  # repr: nan figures equal
    print(json.dumps({k: round(runs[f"{k}_s"], 1) for k in ("local", "ray")}))
