"""The one declaration of what each result depends on (searchrl/config/): every field is
declared, operational fields key nothing, and each kind of setting reaches exactly the results
that read it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from searchrl.config import (
    BUILT_BY,
    OPERATIONAL,
    RESULTS,
    STAGE_NAMES,
    PipelineConfig,
    Section,
    field_shapes,
    load_config,
)
from searchrl.datasets.io import records_fingerprint
from searchrl.stages import STAGES
from searchrl.train.grpo.checkpoint import run_identity
from searchrl.types import Passage, QAExample

SEARCHING = {"build_index", "filter_curriculum", "train_policy", "evaluate_policy",
             "cold_start", "train_run"}


def _keys(config: PipelineConfig) -> dict[str, str]:
    return {r: config.fingerprint_of(r) for r in RESULTS}


def _changed(*overrides: str) -> set[str]:
    base = load_config("configs/tiny.yaml")
    other = load_config("configs/tiny.yaml", list(overrides))
    assert base != other, overrides
    a, b = _keys(base), _keys(other)
    return {r for r in RESULTS if a[r] != b[r]}


def _sections(model: type[BaseModel]) -> list[type[Section]]:
    found: list[type[Section]] = []
    for info in model.model_fields.values():
        for arg in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, Section) and arg not in found:
                found += [arg, *_sections(arg)]
    return found


def test_the_stage_table_is_the_declared_one() -> None:
    assert tuple(STAGES) == STAGE_NAMES
    assert set(BUILT_BY) | set(STAGE_NAMES) == set(RESULTS)


def test_every_top_level_section_declares_what_it_shapes() -> None:
    # Nothing inherits a declaration by accident: each section of the YAML says it.
    for name, info in PipelineConfig.model_fields.items():
        section = info.annotation
        assert isinstance(section, type) and issubclass(section, Section), name
        assert section.SHAPES is not None, f"{section.__name__} declares no SHAPES"


def test_every_field_resolves_to_known_results() -> None:
    for section in _sections(PipelineConfig):
        for name in section.model_fields:
            marks = field_shapes(section, name, OPERATIONAL)
            assert marks.results <= set(RESULTS), (section.__name__, name)


@pytest.mark.parametrize("override", [
    "index.service_rate_limit_per_s=5", "index.service_port=8123", "index.mode=service",
    "index.client_timeout_s=3", "index.client_retries=9", "index.max_batch=64",
    "index.service_workers=2", "index.bm25_threads=2", "tracking.connect_timeout_s=3",
    "train.launch.stall_timeout_s=100", "train.keep_checkpoints=5",
    "train.checkpoint_every=7", "rollout.vllm_gpu_memory_utilization=0.8",
    "tracking.experiment=other",
])
def test_an_operational_setting_keys_nothing(override: str) -> None:
    assert _changed(override) == set()


@pytest.mark.parametrize("override", [
    "index.hybrid_weights={bm25: 2.0, dense: 1.0}", "index.rrf_k=30",
    "index.query_prefix='q: '", "index.hnsw_ef_search=128", "index.ivf_nprobe=16",
])
def test_a_search_time_setting_reaches_exactly_what_searches(override: str) -> None:
    # The index components are not rebuilt; the index's recall and every rollout are.
    assert _changed(override) == SEARCHING


def test_a_build_setting_rebuilds_its_component_only() -> None:
    assert _changed("index.bm25_k1=1.2") == SEARCHING | {"index.bm25"}
    assert _changed("index.hnsw_m=16") == SEARCHING | {"index.faiss"}
    assert _changed("index.encoder_batch_size=8") == SEARCHING | {"index.dense"}
    assert _changed("index.eval_top_k=[1, 5]") == {"build_index"}


def test_more_steps_retrain_but_neither_re_estimate_nor_start_another_run() -> None:
    # train.steps=200 no longer re-runs the difficulty estimate, and a longer run resumes.
    assert _changed("train.steps=200") == {"train_policy"}
    assert _changed("train.lr=1e-3") == {"train_policy", "train_run"}


def test_the_cold_start_settings_reach_every_stage_that_uses_it() -> None:
    assert _changed("train.sft.epochs=5") == {"cold_start", "filter_curriculum",
                                              "train_policy"}
    assert _changed("curriculum.min_pass_rate=0.1") == {"filter_curriculum"}
    assert _changed("curriculum.max_refill_rounds=1") == {"filter_curriculum", "train_policy",
                                                         "train_run"}
    assert _changed("gate.max_payback_months=3") == {"decide_go_no_go"}
    assert _changed("validate.max_hops=3") == {"validate_gold_labels"}


def test_inputs_of_names_only_declared_fields() -> None:
    inputs = load_config("configs/tiny.yaml").inputs_of("filter_curriculum")
    assert "train" in inputs and set(inputs["train"]) == {"sft"}
    assert "service_port" not in inputs["index"] and "tracking" not in inputs
    with pytest.raises(ValueError, match="unknown result"):
        PipelineConfig().inputs_of("nope")


def test_run_identity_follows_gold_answers_not_just_ids(tmp_path: Path) -> None:
    config = load_config("configs/tiny.yaml")
    questions = [QAExample(id="q1", question="Where was Ann born?", golden_answers=("Oslo",)),
                 QAExample(id="q2", question="Who founded Acme?", golden_answers=("Bo",))]
    corrected = [questions[0], questions[1].model_copy(update={"golden_answers": ("Cy",)})]
    (tmp_path / "init").mkdir()

    def identity(cfg: PipelineConfig, qs: list[QAExample], code: str = "trainer") -> str:
        return run_identity(cfg, qs, tmp_path / "init", 1, init_key_file=tmp_path / "key",
                            code=code)

    base = identity(config, questions)
    assert identity(config, corrected) != base  # a steward's correction is another run
    assert identity(config, questions[::-1]) != base  # the order is the curriculum's
    longer = load_config("configs/tiny.yaml", ["train.steps=500", "train.keep_checkpoints=9"])
    assert identity(longer, questions) == base  # more steps resume the same run
    assert identity(load_config("configs/tiny.yaml", ["train.lr=0.5"]), questions) != base
    assert identity(config, questions, code="edited trainer") != base  # no resume across code


def test_records_fingerprint_reads_every_field() -> None:
    a = Passage(id="p1", title="Ann", contents="Ann was born in Oslo.")
    assert records_fingerprint([a]) != records_fingerprint(
        [a.model_copy(update={"contents": "Ann was born in Bergen."})])
    assert records_fingerprint([a]) == records_fingerprint([a.model_copy()])
