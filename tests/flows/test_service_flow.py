"""`index.mode=service` end to end under prefect_test_harness: the flow starts the retrieval
server for the first searching stage, curriculum / train / evaluate search through it (a
re-run with them cached never starts it), it stops with the flow; the greedy evaluation
equals the same pipeline's in-process one.

The search side runs the demo's own settings (configs/tiny.yaml's data, index and server
limits), so the cold start's demonstration search sends the demo's batches: ~600 questions
and ~300 titles, above the server's max_batch of 256, which answered 413 until the client
split batches to the server's limits. Shrunk, for time only (the full demo takes ~6 minutes,
twice here): the model-side work (SFT demos, epochs, extra worlds and corpus language
modelling; curriculum questions and samples; training steps; evaluated questions), as in
the pipeline flow test."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from flows.pipeline import pipeline
from searchrl.eval.results import load_eval_result, read_question_results
from searchrl.retrieval.service import check_port_free
from searchrl.tracking import child_runs
from tests.flows.test_pipeline_flow import FAST, STAGES
from tests.helpers import free_port

# Twice the pipeline at the demo's search settings (~2.5 min on 2 cores): CI's slow run.
pytestmark = pytest.mark.slow

# FAST without its smaller world: only the model-side work stays shrunk. With the demo's
# world, the cold start's 8 extra worlds (BM25 each) and its language modelling on every
# passage cost ~3 minutes per pipeline on 2 cores; neither searches the served index.
DEMO_SEARCH = [*(o for o in FAST if not o.startswith("data.")), "train.sft.extra_worlds=0",
               "train.sft.corpus_lm=false"]
DEMO_MAX_BATCH = 256  # configs/tiny.yaml's index.max_batch (the default)


@pytest.fixture(scope="module")
def runs(prefect_harness: None, tmp_path_factory: pytest.TempPathFactory
         ) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("service_flow")
    # The demo's world (no data.* overrides); BM25 only, as tiny.yaml; retrieve_once searches
    # every eval question whatever the 1-step policy does.
    base = [*DEMO_SEARCH, "eval.baselines=[retrieve_once]",
            f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}"]
    port = free_port()
    inprocess = pipeline(config_path="configs/tiny.yaml",
                         overrides=[*base, f"run.work_dir={tmp / 'inprocess'}"])
    service_overrides = [
        *base, f"run.work_dir={tmp / 'service'}", "index.mode=service",
        f"index.service_port={port}", f"index.service_url=http://127.0.0.1:{port}"]
    service = pipeline(config_path="configs/tiny.yaml", overrides=service_overrides)
    return {"inprocess": inprocess, "service": service, "port": port,
            "service_overrides": service_overrides,
            "service_dir": tmp / "service" / "retrieval_service"}


def _answers(result: dict[str, Any]) -> dict[str, Any]:
    evaluation = load_eval_result(result["evaluation"].results_path)
    out: dict[str, Any] = {}
    for name, system in evaluation.systems.items():
        questions = read_question_results(system.questions_path)
        trajectories = [json.loads(line) for line in
                        Path(system.trajectories_path).read_text().splitlines()]
        out[name] = {"em": system.summary.em.mean,
                     "answers": [(q.example_id, q.answer, q.em, q.searches, q.search_errors)
                                 for q in questions],
                     "retrieved": [t["retrieved_doc_ids"] for t in trajectories]}
    return out


def test_service_pipeline_evaluates_exactly_like_inprocess(runs: dict[str, Any]) -> None:
    inprocess, service = _answers(runs["inprocess"]), _answers(runs["service"])
    assert set(service) == set(inprocess) == {"trained", "retrieve_once"}
    for name in inprocess:
        assert service[name] == inprocess[name], name
    assert all(errors == 0 for system in service.values()
               for *_, errors in system["answers"])
    assert all(service["retrieve_once"]["retrieved"])  # every question searched, and found


def test_the_flow_ran_the_server_for_the_searching_stages_and_stopped_it(
        runs: dict[str, Any]) -> None:
    service = runs["service"]
    children = child_runs(service["tracking_uri"], service["parent_run_id"])
    assert {c["stage"] for c in children} == STAGES
    assert all(c["status"] == "FINISHED" for c in children)
    stats = json.loads((runs["service_dir"] / "stats.json").read_text())
    assert stats["totals"]["queries"] > 0 and stats["totals"]["failed"] == 0
    assert stats["totals"]["unauthorized"] == 0 and stats["totals"]["rejected"] == 0
    # The demo's batches were larger than the server takes: the client split them.
    assert stats["totals"]["largest_batch"] == DEMO_MAX_BATCH
    check_port_free("127.0.0.1", runs["port"])  # stopped
    # The generated token lived for the flow run only.
    assert "SEARCHRL_RETRIEVER_TOKEN" not in os.environ


def test_a_rerun_whose_searching_stages_are_cached_never_starts_the_server(
        runs: dict[str, Any]) -> None:
    log = runs["service_dir"] / "server.log"
    started = log.stat().st_mtime_ns
    again = pipeline(config_path="configs/tiny.yaml", overrides=runs["service_overrides"])
    assert not child_runs(again["tracking_uri"], again["parent_run_id"])  # all from cache
    assert again["decision"].label == runs["service"]["decision"].label
    assert log.stat().st_mtime_ns == started  # the server was not started again
    check_port_free("127.0.0.1", runs["port"])
