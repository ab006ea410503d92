"""The real Prefect flow under prefect_test_harness with a local sqlite MLflow store: all six
stages run for real (tiny sizes), each an MLflow child run of one parent run."""

from __future__ import annotations

import json
import runpy
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from flows.pipeline import pipeline
from searchrl import codehash, stages
from searchrl.config import ConfigError
from searchrl.eval.baselines import TRAINED
from searchrl.eval.results import load_eval_result
from searchrl.stages import REF_FILE
from searchrl.tracking import child_runs
from searchrl.train import stage as train_stage
from searchrl.train.cold_start.build import SFT_STATS_FILE
from tests.conftest import REPO_ROOT

# Small enough for the default test run; every stage still runs for real.
FAST = [
    "data.synthetic.n_people=60", "data.synthetic.n_organisations=15",
    "data.synthetic.n_train=60", "data.synthetic.n_dev=10", "data.synthetic.n_test=20",
    "train.sft.n_demos=24", "train.sft.epochs=1", "train.sft.extra_world_demos=0",
    "curriculum.max_questions=4",
    "curriculum.samples_per_question=2", "train.steps=1", "train.questions_per_step=2",
    "rollout.group_size=2", "rollout.max_new_tokens_per_turn=16", "train.checkpoint_every=0",
    "eval.max_questions=6", "eval.max_questions_per_set=6", "eval.bootstrap_samples=100",
    "eval.baselines=[no_search]",
]
STAGES = {"validate_gold_labels", "build_index", "filter_curriculum", "train_policy",
          "evaluate_policy", "decide_go_no_go"}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    tmp = tmp_path_factory.mktemp("pipeline")
    return [*FAST, f"run.work_dir={tmp / 'work'}",
            f"tracking.tracking_uri=sqlite:///{tmp / 'mlflow.db'}"]


@pytest.fixture(scope="module")
def first_run(prefect_harness: None, workspace: list[str]) -> dict[str, Any]:
    return pipeline(config_path="configs/tiny.yaml", overrides=workspace)


def test_pipeline_creates_parent_and_child_runs(first_run: dict[str, Any]) -> None:
    children = child_runs(first_run["tracking_uri"], first_run["parent_run_id"])
    stages = {c["stage"]: c for c in children}
    assert set(stages) == STAGES
    assert all(c["status"] == "FINISHED" for c in children)
    assert stages["validate_gold_labels"]["metrics"]["rows_in"] > 0
    assert stages["train_policy"]["metrics"]["steps"] == 1
    assert Path(first_run["dataset"].paths["train"]).is_file()
    assert Path(first_run["checkpoint"].policy_dir).is_dir()
    # The cold start's SFT ran on run.device (auto: the CPU here; scripts/gpu_smoke.sh: cuda).
    sft_stats = Path(first_run["checkpoint"].sft_dir) / SFT_STATS_FILE
    assert json.loads(sft_stats.read_text())["sft_device"] == "cpu"
    decision = first_run["decision"]
    assert decision.reasons and Path(decision.report_html or "").is_file()


def test_the_design_table_reports_what_the_pipeline_run_wrote(
        first_run: dict[str, Any], workspace: list[str], tmp_path: Path) -> None:
    # benchmarks/bench_candidates.py (issue 43 §2) reads a finished run's dir as it is.
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))  # as when run as a script
    try:
        bench = runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_candidates.py"),
                               run_name="bench_candidates")
    finally:
        sys.path.remove(str(REPO_ROOT / "benchmarks"))
    work_dir = Path(next(o for o in workspace if o.startswith("run.work_dir=")).split("=", 1)[1])
    shutil.copytree(work_dir, tmp_path / "tiny")
    got = bench["figures"](tmp_path, "tiny")
    result = load_eval_result(work_dir / "evaluate_policy" / "results.json")
    assert got["em"]["trained"]["mean"] == result.systems[TRAINED].summary.em.mean
    assert got["steps"].steps == 1  # train.steps=1
    assert got["pass"]["questions"] == 4 and got["pass"]["k"] == [2]  # the curriculum's FAST
    assert got["seconds"] is None  # not run by the bench: no whole-process wall
    table = bench["tables"]({"tiny": got})
    assert f"| tiny | {got['parameters']:,} |" in table and "of 1 |" in table
    # A sealed world is refused before anything runs.
    with pytest.raises(ConfigError, match="tuning"):
        bench["run_candidate"]("tiny", 2027, tmp_path, [])
    assert not (tmp_path / "tiny.log").exists()


def test_rerun_skips_finished_stages_and_a_change_reruns_only_downstream(
        first_run: dict[str, Any], workspace: list[str]) -> None:
    second = pipeline(config_path="configs/tiny.yaml", overrides=workspace)
    for key in ("dataset", "index", "curriculum", "checkpoint", "evaluation"):
        assert second[key] == first_run[key], key
    assert child_runs(second["tracking_uri"], second["parent_run_id"]) == []
    # An evaluation setting changes: evaluation and the gate re-run, nothing upstream does.
    third = pipeline(config_path="configs/tiny.yaml",
                     overrides=[*workspace, "eval.bootstrap_samples=200"])
    rerun = {c["stage"] for c in child_runs(third["tracking_uri"], third["parent_run_id"])}
    assert rerun == {"evaluate_policy", "decide_go_no_go"}
    assert third["checkpoint"] == first_run["checkpoint"]


def _stages_run(result: dict[str, Any]) -> set[str]:
    return {c["stage"] for c in child_runs(result["tracking_uri"], result["parent_run_id"])}


def test_editing_a_library_module_reruns_the_stages_that_reach_it(
        first_run: dict[str, Any], workspace: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # As if rl/rewards.py had been edited: its digest changes, every other file's stays.
    real = codehash.known_sha256
    monkeypatch.setattr(codehash, "known_sha256", lambda path: real(path) + (
        "-edited" if path.parts[-2:] == ("rl", "rewards.py") else ""))
    rerun = pipeline(config_path="configs/tiny.yaml", overrides=workspace)
    assert _stages_run(rerun) == STAGES - {"validate_gold_labels", "build_index"}


@pytest.mark.slow  # two more pipeline runs (~30 s): CI's slow run
def test_cached_results_whose_files_are_gone_rerun(first_run: dict[str, Any],
                                                   workspace: list[str]) -> None:
    # `make clean`: the work dir goes; the result store still holds the old references.
    shutil.rmtree(Path(first_run["dataset"].corpus_path).parents[2])
    again = pipeline(config_path="configs/tiny.yaml", overrides=workspace)
    assert _stages_run(again) == STAGES
    assert Path(again["checkpoint"].policy_dir).is_dir()
    assert Path(again["decision"].report_html or "").is_file()
    # and the re-run's results are cached in their turn
    third = pipeline(config_path="configs/tiny.yaml", overrides=workspace)
    assert _stages_run(third) == set()


@pytest.mark.slow  # a whole second pipeline run (~2 min): CI's slow run
def test_a_second_checkout_runs_its_own_stages(
        prefect_harness: None, first_run: dict[str, Any], workspace: list[str],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo_root: Path) -> None:
    # Same config with a relative work dir, run from another checkout (same user, same Prefect
    # result store): nothing may come from the first checkout's cache.
    checkout = tmp_path / "checkout"
    for part in ("configs", "data", "data_contracts"):
        shutil.copytree(repo_root / part, checkout / part)
    monkeypatch.chdir(checkout)
    relative = [o for o in workspace if not o.startswith("run.work_dir=")]
    first = pipeline(config_path="configs/tiny.yaml", overrides=[*relative, "run.work_dir=runs/t"])
    assert _stages_run(first) == STAGES
    assert Path(first["checkpoint"].policy_dir).is_relative_to(checkout / "runs" / "t")
    second_checkout = tmp_path / "checkout2"
    shutil.copytree(checkout, second_checkout, ignore=shutil.ignore_patterns("runs"))
    monkeypatch.chdir(second_checkout)
    second = pipeline(config_path="configs/tiny.yaml",
                      overrides=[*relative, "run.work_dir=runs/t"])
    assert _stages_run(second) == STAGES
    assert Path(second["dataset"].corpus_path).is_relative_to(second_checkout)


@pytest.mark.slow  # a pipeline of its own, run twice (~1 min): CI's slow run
def test_a_comparator_failing_after_grpo_leaves_the_train_stage_incomplete_then_resumes(
        prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rejection-sampling comparator is built after GRPO: until it is, the stage's ref.json
    # (which marks it complete) is not on disk, so nothing downstream reads a reference
    # without it; the rerun resumes the finished training and builds it.
    overrides = [*FAST, f"run.work_dir={tmp_path / 'work'}",
                 f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    train_dir = tmp_path / "work" / "train_policy"

    def broken(*args: Any, **kwargs: Any) -> Any:
        assert (train_dir / "policy").is_dir()  # GRPO has finished by now
        raise RuntimeError("the comparator broke")

    with monkeypatch.context() as patch:
        patch.setattr(train_stage, "build_rejection_sampling", broken)
        state = pipeline(config_path="configs/tiny.yaml", overrides=overrides,
                         return_state=True)
    assert state.is_failed()
    assert "the comparator broke" in repr(state.result(raise_on_failure=False))
    assert (train_dir / "policy").is_dir() and not (train_dir / REF_FILE).exists()
    assert not (tmp_path / "work" / "evaluate_policy" / "results.json").exists()
    result = pipeline(config_path="configs/tiny.yaml", overrides=overrides)
    checkpoint = result["checkpoint"]
    assert checkpoint.rs_dir and Path(checkpoint.rs_dir).is_dir()
    assert json.loads((train_dir / REF_FILE).read_text())["rs_dir"] == checkpoint.rs_dir


def _trained(results_path: str) -> dict[str, float]:
    """The trained system's summary in an evaluation's results (timings left out)."""
    summary = load_eval_result(results_path).systems[TRAINED].summary
    return {"em": summary.em.mean, "f1": summary.f1.mean,
            "searches": summary.searches_per_question, "tokens": summary.tokens_per_query}


@pytest.mark.slow  # three pipeline runs (~4 min): CI's slow run
def test_two_runs_at_once_on_one_work_dir_each_decide_on_their_own_numbers(
        prefect_harness: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Run A (seed 1) evaluates, then run B (seed 2: another cold start, policy and numbers)
    # runs whole on the same work dir before A's gate: B replaces train_policy/ and
    # evaluate_policy/. A's gate must not decide (nor register) on B's numbers.
    shared = [*FAST, f"run.work_dir={tmp_path / 'work'}",
              f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    run_a, run_b = [*shared, "run.seed=1"], [*shared, "run.seed=2"]
    a_at_gate, b_done = threading.Event(), threading.Event()
    a_numbers: dict[str, Any] = {}
    real_gate = stages.decide_go_no_go

    def gate(config: Any, dataset: Any, curriculum: Any, checkpoint: Any, evaluation: Any,
             sink: Any) -> Any:
        if config.run.seed == 1 and not a_at_gate.is_set():
            a_numbers.update(_trained(evaluation.results_path))
            a_at_gate.set()
            assert b_done.wait(900), "run B did not finish"
        return real_gate(config, dataset, curriculum, checkpoint, evaluation, sink)

    monkeypatch.setattr(stages, "decide_go_no_go", gate)
    outcome: dict[str, Any] = {}
    first_a = threading.Thread(target=lambda: outcome.update(a=pipeline(
        config_path="configs/tiny.yaml", overrides=run_a, return_state=True)))
    first_a.start()
    try:
        assert a_at_gate.wait(900), "run A did not reach its gate"
        b = pipeline(config_path="configs/tiny.yaml", overrides=run_b)
    finally:
        b_done.set()
        first_a.join(900)
    # B decided on B's numbers, which are not A's (the test would pass vacuously otherwise).
    b_numbers = _trained(b["evaluation"].results_path)
    assert b_numbers != a_numbers
    assert b["decision"].figures["em_trained"] == pytest.approx(b_numbers["em"])
    # A refused: its checkpoint (or evaluation) on disk is B's now; no decision, no registry.
    state = outcome["a"]
    assert state.is_failed()
    error = repr(state.result(raise_on_failure=False))
    assert "ReplacedInputError" in error and "wrote it for this run" in error, error
    # Re-run A: the stages B replaced run again for A, and A decides on A's own numbers.
    a = pipeline(config_path="configs/tiny.yaml", overrides=run_a)
    assert _trained(a["evaluation"].results_path) == a_numbers
    assert a["decision"].figures["em_trained"] == pytest.approx(a_numbers["em"])
    assert {"train_policy", "evaluate_policy", "decide_go_no_go"} <= _stages_run(a)
