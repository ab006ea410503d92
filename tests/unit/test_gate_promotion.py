"""Promotion that never makes things worse: the gate stage registers every candidate as
`challenger` (tagged with its decision, figures and data fingerprints), a GO that is not worse
than the current champion moves `champion` (keeping `previous-champion`), and
`python -m searchrl rollback` restores the previous one with a recorded reason. And
train.init=champion: training starts from the downloaded champion, whose version is in the
train stage's cache key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from searchrl.__main__ import main
from searchrl.config import PipelineConfig
from searchrl.contracts.drift import history_dir
from searchrl.data.io import write_jsonl
from searchrl.eval.baselines import TRAINED
from searchrl.eval.results import RESULTS_FILE
from searchrl.stages import (
    STAGES,
    StageInputError,
    champion_start,
    decide_go_no_go,
    fetch_champion_start,
)
from searchrl.tracking import (
    CHALLENGER,
    PREVIOUS,
    MlflowSink,
    model_version_tags,
    registered_policy,
    start_parent_run,
)
from searchrl.types import CheckpointRef, DatasetRef, EvalRef
from tests.helpers import save_tiny_policy
from tests.unit.test_gate_report import _eval

GATE = {"gpu_price_per_hour": 2.0, "production_queries_per_month": 100_000,
        "min_gold_pairs": 100, "max_payback_months": 6.0, "min_accuracy_margin": 0.05,
        "allow_stand_in_comparator": True, "comparison_baseline": "retrieve_once"}


def _config(tmp: Path, uri: str, **train: object) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run": {"name": "world-b", "work_dir": str(tmp / "work")},
        "tracking": {"tracking_uri": uri}, "gate": GATE, "train": train})


def _gate(tmp: Path, config: PipelineConfig, uri: str, policy: Path,
          accs: dict[str, float], tag: str) -> MlflowSink:
    sub = tmp / tag
    sub.mkdir()
    results = sub / RESULTS_FILE
    results.write_text(json.dumps(_eval(sub, accs).to_dict()))
    train = sub / "train.jsonl"
    write_jsonl(train, [{"q": i} for i in range(150)])
    digest = sub / "gold_digest"  # what validation leaves for the drift report
    digest.mkdir()
    (digest / "meta.json").write_text(json.dumps({"run": tag}))
    dataset = DatasetRef(paths={"train": str(train)}, fingerprints={"train": "fp-train"},
                         corpus_path="", corpus_fingerprint="fp-corpus", fingerprint="x",
                         digest_dir=str(digest))
    ckpt = CheckpointRef(policy_dir=str(policy), fingerprint=f"policy-{tag}",
                         training_seconds=36.0)
    sink = start_parent_run(uri, "exp", f"gate-{tag}", {})
    decide_go_no_go(config, dataset, ckpt, EvalRef(results_path=str(results),
                                                   fingerprint=f"eval-{tag}"), sink)
    return sink


def _champion_digest(config: PipelineConfig) -> str | None:
    """Whose gold-set digest the next drift report compares with (kept by the gate on GO)."""
    meta = history_dir(config.run.work_dir) / "champion" / "meta.json"
    return json.loads(meta.read_text())["run"] if meta.is_file() else None


def _alias(uri: str, alias: str) -> str | None:
    found = registered_policy(uri, "searchrl-world-b", alias)
    return found["version"] if found else None


def test_candidates_are_challengers_a_go_never_replaces_a_stronger_champion_and_rollback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = _config(tmp_path, uri)
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    # 1. No champion yet: GO, the registry model is named after the pipeline.
    _gate(tmp_path, config, uri, policy, {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    assert (_alias(uri, CHALLENGER), _alias(uri, "champion"), _alias(uri, PREVIOUS)) == \
        ("1", "1", None)
    assert _champion_digest(config) == "a"
    tags = model_version_tags(uri, "searchrl-world-b", "1")
    assert tags["decision"] == "GO" and tags["data.train"] == "fp-train"
    assert tags["data.corpus"] == "fp-corpus" and tags["policy_fingerprint"] == "policy-a"
    assert tags["eval_fingerprint"] == "eval-a" and float(tags["figure.em_trained"]) == 0.6
    # 2. Far above the comparator but worse than the champion: registered, not promoted.
    _gate(tmp_path, config, uri, policy,
          {"retrieve_once": 0.2, "champion": 0.8, TRAINED: 0.6}, "b")
    assert (_alias(uri, CHALLENGER), _alias(uri, "champion")) == ("2", "1")
    assert model_version_tags(uri, "searchrl-world-b", "2")["decision"] == "NO-GO"
    assert _champion_digest(config) == "a"  # a NO-GO leaves the champion's gold set alone
    decision = json.loads((tmp_path / "work" / "decide_go_no_go" / "decision.json").read_text())
    failed = [c for c in decision["checks"] if not c["passed"]]
    assert [c["name"] for c in failed] == ["champion"] and "version 1" in failed[0]["detail"]
    # 3. As good as the champion: GO, the champion it replaces is kept.
    _gate(tmp_path, config, uri, policy,
          {"retrieve_once": 0.2, "champion": 0.6, TRAINED: 0.6}, "c")
    assert (_alias(uri, "champion"), _alias(uri, PREVIOUS)) == ("3", "1")
    assert _champion_digest(config) == "c"
    # 4. Rollback from the CLI: champion back to 1, the reason recorded.
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(config.to_dict()))
    assert main(["rollback", "--config", str(cfg)]) == 2  # a reason is required
    assert main(["rollback", "--config", str(cfg), "--reason", "wrong answers on live"]) == 0
    assert json.loads(capsys.readouterr().out)["to_version"] == "1"
    assert _alias(uri, "champion") == "1" and _alias(uri, PREVIOUS) is None
    assert model_version_tags(uri, "searchrl-world-b", "3")["rolled_back_reason"] == \
        "wrong answers on live"
    assert main(["rollback", "--config", str(cfg), "--reason", "again"]) == 11


def test_train_init_champion_downloads_it_and_keys_the_stage_on_its_version(
        tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    config = _config(tmp_path, uri, init="champion")
    out = tmp_path / "train"
    out.mkdir()
    key = STAGES["train_policy"].external_inputs
    assert key is not None
    assert key(config) == "champion:searchrl-world-b:none"
    assert key(_config(tmp_path, uri)) == "init:base"
    with pytest.raises(StageInputError, match="no searchrl-world-b@champion"):
        fetch_champion_start(config, out, uri)
    with pytest.raises(StageInputError, match=r"champion_start\.json not found"):
        champion_start(config, out)
    policy = save_tiny_policy(["who is the mayor of paris"], tmp_path / "policy")
    _gate(tmp_path, _config(tmp_path, uri), uri, policy,
          {"retrieve_once": 0.2, TRAINED: 0.6}, "a")
    assert key(config) == "champion:searchrl-world-b:1"
    got = fetch_champion_start(config, out, uri)
    assert got is not None and champion_start(config, out) == got
    assert (got / "config.json").is_file() and (got / "tokenizer.json").is_file()
    assert json.loads((got / "searchrl_sft.json").read_text())["version"] == "1"
    assert fetch_champion_start(_config(tmp_path, uri), out, uri) is None
    assert champion_start(_config(tmp_path, uri), out) is None
