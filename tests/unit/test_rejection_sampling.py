"""Rejection sampling (train/rejection_sampling.py): which samples are kept, the loss mask of the
fine-tune, the reuse of the curriculum estimate's samples, the cache, and the evaluated
system (eval/baselines.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from searchrl.config import PipelineConfig
from searchrl.eval.baselines import TRAINED, plan_systems
from searchrl.generation.factory import load_policy_on_device
from searchrl.models.tiny import load_policy
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rollout import RolloutBatch
from searchrl.train import rejection_sampling as rejection
from searchrl.train.cold_start.build import SFT_KEY_FILE
from searchrl.train.cold_start.sft import TokenizedDemo, collate_demos, masked_nll
from searchrl.train.rejection_sampling import (
    RS_KEY_FILE,
    build_rejection_sampling,
    read_estimate_samples,
    rollout_demo,
    select_samples,
    usable,
    write_estimate_samples,
)
from searchrl.types import QAExample
from tests.train_fixture import build_init_policy, tiny_config

PROMPT = [11, 12, 13]
INFO = [40, 41, 42]  # an inserted <information> block: never a target


def _record(example_id: str, index: int, *, correct: bool = True, fmt: float = 1.0,
            errors: int = 0, sampled: Sequence[int] = (20, 21)) -> RolloutRecord:
    """Sampled tokens, an inserted block, sampled tokens again (as the rollout loop masks)."""
    first, second = list(sampled), [30 + index, 31]
    return RolloutRecord(
        example_id=example_id, sample_index=index, prompt_ids=PROMPT,
        response_ids=first + INFO + second,
        loss_mask=[1] * len(first) + [0] * len(INFO) + [1] * len(second),
        old_logprobs=[0.0] * (len(first) + len(INFO) + len(second)), text="", turns=2,
        correct=correct, reward_parts={"format": fmt}, search_errors=errors)


def test_only_correct_well_formed_samples_without_failed_searches_are_kept() -> None:
    records = [_record("a", 0), _record("a", 1, correct=False), _record("b", 0, fmt=0.0),
               _record("b", 1, errors=1), _record("c", 0), _record("c", 1)]
    assert [usable(r) for r in records] == [True, False, False, False, True, True]
    kept = select_samples(records)
    assert [(r.example_id, r.sample_index) for r in kept] == [("a", 0), ("c", 0), ("c", 1)]
    # The same trajectory twice for one question is one example.
    assert len(select_samples([_record("a", 0), _record("a", 0)])) == 1


def test_the_fine_tune_learns_only_the_tokens_the_policy_sampled(tmp_path: Path) -> None:
    record = _record("a", 0)
    demo = rollout_demo(record)
    assert demo.input_ids == PROMPT + record.response_ids
    assert demo.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    # The trainer's targets: input j + 1 is learnt iff the policy sampled it.
    _, _, target = collate_demos([demo], pad_id=0)
    assert target[0].tolist() == [float(m) for m in demo.loss_mask[1:]]
    # Inserted tokens are no target: changing a trailing inserted block leaves the loss as is.
    model, _ = load_policy(build_init_policy(tmp_path / "p"))
    tail = TokenizedDemo(demo.input_ids + INFO, demo.loss_mask + [0] * len(INFO))
    other = TokenizedDemo([*demo.input_ids, 50, 51, 52], tail.loss_mask)
    with torch.no_grad():
        losses = [float(masked_nll(model, *collate_demos([d], pad_id=0))) for d in (tail, other)]
    assert losses[0] == pytest.approx(losses[1])


def _questions(n: int) -> list[QAExample]:
    return [QAExample(id=f"q{i}", question=f"Who is {i}?", golden_answers=("x",), hops=1)
            for i in range(n)]


def _config(tmp: Path, **rs: Any) -> PipelineConfig:
    cfg = tiny_config(tmp)
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={
        "rejection_sampling": cfg.train.rejection_sampling.model_copy(
            update={"enabled": True, "samples_per_question": 2, "epochs": 1} | rs)})})


@pytest.fixture
def start(tmp_path: Path) -> Path:
    """A saved policy standing in for the cold start (with its key, as cold_start writes)."""
    sft = build_init_policy(tmp_path / "sft")
    (sft / SFT_KEY_FILE).write_text(json.dumps({"cold": "start"}))
    return sft


def _estimate(questions: Sequence[QAExample], per_question: int) -> list[RolloutRecord]:
    """q0: both samples right; q1: one right, one wrong; q2: none right; a third sample each."""
    out = []
    for q in questions:
        for g in range(per_question):
            right = q.id == "q0" or (q.id == "q1" and g == 0) or (q.id == "q0" and g == 2)
            out.append(_record(q.id, g, correct=right))
    return out


def test_reuses_the_estimate_samples_and_a_second_call_reuses_the_policy(
        tmp_path: Path, start: Path) -> None:
    cfg = _config(tmp_path)
    questions = _questions(3)
    samples = write_estimate_samples(tmp_path / "samples.jsonl", _estimate(questions, 3),
                                     policy_dir=start, config=cfg)
    out = tmp_path / "rs"
    # No searcher: every question is covered by the estimate, nothing is sampled again.
    result = build_rejection_sampling(cfg, questions, start, None, out,  # type: ignore[arg-type]
                                samples_path=samples, progress=False)
    assert result.built and result.policy_dir == out and result.seconds > 0
    m = result.metrics
    # samples_per_question 2 of the 3 drawn: q0 0,1 right; q1 0 right; q2 none.
    assert (m["rs_samples"], m["rs_correct"], m["rs_kept"]) == (6, 3, 3)
    assert m["rs_questions_with_a_correct_sample"] == 2
    assert (m["rs_reused_questions"], m["rs_sampled_questions"]) == (3, 0)
    assert m["rs_steps"] >= 1 and "rs_final_loss" in m
    before = load_file(str(start / "model.safetensors"))
    after = load_file(str(out / "model.safetensors"))
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # The same inputs: reused as is, with the recorded figures.
    stamp = (out / RS_KEY_FILE).stat().st_mtime_ns
    again = build_rejection_sampling(cfg, questions, start, None, out,  # type: ignore[arg-type]
                               samples_path=samples, progress=False)
    assert not again.built and again.seconds == result.seconds and again.metrics == m
    assert (out / RS_KEY_FILE).stat().st_mtime_ns == stamp
    # Another setting of its own is another policy.
    changed = build_rejection_sampling(_config(tmp_path, epochs=2), questions, start,
                                 None, out, samples_path=samples,  # type: ignore[arg-type]
                                 progress=False)
    assert changed.built and changed.metrics["rs_steps"] == 2 * m["rs_steps"]


def test_estimate_samples_of_another_start_or_sampling_are_not_reused(
        tmp_path: Path, start: Path) -> None:
    cfg = _config(tmp_path)
    samples = write_estimate_samples(tmp_path / "s.jsonl", _estimate(_questions(2), 2),
                                     policy_dir=start, config=cfg)
    found = read_estimate_samples(samples, policy_dir=start, config=cfg)
    assert found is not None
    drawn, kept = found
    assert drawn == {"q0": 2, "q1": 2}
    assert [r.sample_index for r in kept["q1"]] == [0]  # only usable ones are stored
    assert kept["q0"][0].response_ids == _record("q0", 0).response_ids
    hotter = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"temperature": 0.5})})
    assert read_estimate_samples(samples, policy_dir=start, config=hotter) is None
    (start / SFT_KEY_FILE).write_text(json.dumps({"another": "start"}))
    assert read_estimate_samples(samples, policy_dir=start, config=cfg) is None


def test_questions_the_estimate_did_not_cover_are_sampled(
        tmp_path: Path, start: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _config(tmp_path, max_questions=3)
    questions = _questions(4)  # q3 is beyond max_questions
    samples = write_estimate_samples(tmp_path / "s.jsonl", _estimate(questions[:1], 2),
                                     policy_dir=start, config=cfg)
    calls: list[tuple[list[str], int]] = []

    def rollouts(examples: Sequence[QAExample], generator: Any, searcher: Any, *args: Any,
                 group_size: int, **kwargs: Any) -> RolloutBatch:
        calls.append(([ex.id for ex in examples], group_size))
        return RolloutBatch(records=[_record(ex.id, g, correct=g == 0) for ex in examples
                                     for g in range(group_size)], stats={})

    monkeypatch.setattr(rejection, "run_rollouts", rollouts)
    result = build_rejection_sampling(cfg, questions, start, None, tmp_path / "rs",  # type: ignore[arg-type]
                                samples_path=samples, progress=False)
    assert calls == [(["q1", "q2"], 2)]
    m = result.metrics
    assert (m["rs_reused_questions"], m["rs_sampled_questions"], m["rs_samples"]) == (1, 2, 6)
    assert m["rs_questions_with_a_correct_sample"] == 3


def test_the_policy_is_loaded_once_and_the_sampled_model_is_the_one_fine_tuned(
        tmp_path: Path, start: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[Any] = []
    sampled_with: list[Any] = []
    trained: list[Any] = []

    def load(*args: Any, **kwargs: Any) -> Any:
        loaded.append(load_policy_on_device(*args, **kwargs))
        return loaded[-1]

    def generator(config: Any, **kwargs: Any) -> Any:
        sampled_with.append(kwargs.get("model"))
        return None

    def rollouts(examples: Sequence[QAExample], *args: Any, group_size: int,
                 **kwargs: Any) -> RolloutBatch:
        return RolloutBatch(records=[_record(ex.id, g) for ex in examples
                                     for g in range(group_size)], stats={})

    def sft(model: Any, *args: Any, **kwargs: Any) -> Any:
        trained.append(model)
        return run_sft(model, *args, **kwargs)

    run_sft = rejection.run_sft
    monkeypatch.setattr(rejection, "load_policy_on_device", load)
    monkeypatch.setattr(rejection, "make_generator", generator)
    monkeypatch.setattr(rejection, "run_rollouts", rollouts)
    monkeypatch.setattr(rejection, "run_sft", sft)
    build_rejection_sampling(_config(tmp_path), _questions(2), start, None,  # type: ignore[arg-type]
                             tmp_path / "rs", progress=False)
    assert len(loaded) == 1 and sampled_with == trained == [loaded[0][0]]


def test_plan_systems_evaluates_the_rs_policy_when_training_recorded_one() -> None:
    cfg = PipelineConfig()
    specs, notes = plan_systems(("sft", "rejection_sampling"), policy_dir="P", sft_dir="S",
                                champion_dir=None, config=cfg, rs_dir="R")
    assert [(s.name, s.policy, s.mode) for s in specs] == [
        ("sft", "S", "agentic"), ("rejection_sampling", "R", "agentic"),
        (TRAINED, "P", "agentic")]
    assert notes == []
    specs, notes = plan_systems(("sft", "rejection_sampling"), policy_dir="P", sft_dir="S",
                                champion_dir=None, config=cfg)
    assert [s.name for s in specs] == ["sft", TRAINED]
    assert len(notes) == 1 and notes[0].startswith("baseline rejection_sampling skipped")


def test_real_rollouts_of_a_searching_policy_round_trip_and_mask_their_passages(
        tmp_path: Path) -> None:
    """The rollout loop's own records: the usable ones are stored, reused and trained on with
    every inserted `<information>` token masked out."""
    from searchrl.generation.factory import make_generator
    from searchrl.rl.rollout import run_rollouts
    from searchrl.train.cold_start.sft import save_policy
    from searchrl.types import SearchHit
    from tests.tagged_policy import WORDS, demo_tokenizer, searching_model

    class Searcher:
        def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
            return [[SearchHit(f"d-{q}", None, f"{q} is {WORDS[len(q) % 50]}", 1.0)]
                    for q in queries]

    tok = demo_tokenizer()
    sft = tmp_path / "sft"
    save_policy(searching_model(tok), tok, sft)
    (sft / SFT_KEY_FILE).write_text("{}")
    cfg = _config(tmp_path)
    cfg = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(
        update={"temperature": 0.3, "max_turns": 3, "max_response_tokens": 120})})
    # Every word is a gold answer: each well-formed answer is right, some samples are not.
    questions = [QAExample(id=f"q{i}", question=f"what about {WORDS[i]}?",
                           golden_answers=tuple(WORDS)) for i in range(4)]
    records = run_rollouts(questions, make_generator(cfg, policy_dir=sft), Searcher(),
                           cfg.rollout, cfg.reward, group_size=2, seed=1).records
    good = [r for r in records if usable(r)]
    assert good and any(kind == "info" for r in good for kind, _, _ in r.segments)
    for r in good:
        mask = rollout_demo(r).loss_mask[len(r.prompt_ids):]
        for kind, begin, end in r.segments:
            assert set(mask[begin:end]) == ({1} if kind == "sampled" else {0}), kind
    samples = write_estimate_samples(tmp_path / "s.jsonl", records, policy_dir=sft, config=cfg)
    result = build_rejection_sampling(cfg, questions, sft, None, tmp_path / "rs",  # type: ignore[arg-type]
                                      samples_path=samples, progress=False)
    assert result.metrics["rs_reused_questions"] == 4
    assert result.metrics["rs_correct"] == len(good) and result.metrics["rs_steps"] >= 1
