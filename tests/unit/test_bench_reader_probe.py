"""benchmarks/bench_reader_probe.py: its demonstrations hold the gold passages and train only
the answer, its slices partition the dev split where they should, and end to end (a tiny model,
a budget of seconds, a small tuning world) it prints a table of sane figures."""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path
from typing import Any

import pytest

from searchrl.config import load_config
from searchrl.datasets.synthetic import generate_world
from searchrl.generation.base import GenerationOutput
from searchrl.models.tiny import train_tokenizer
from searchrl.rl.prompts import ANSWER_OPEN
from searchrl.text import normalize_answer
from tests.conftest import REPO_ROOT

SMALL = ["data.synthetic.n_people=60", "data.synthetic.n_organisations=15",
         "data.synthetic.n_train=40", "data.synthetic.n_dev=30", "data.synthetic.n_test=10",
         "model.tiny.n_layer=1", "model.tiny.n_embd=32", "model.tiny.n_head=2",
         "model.tiny.vocab_size=300", "train.sft.batch_size=8"]
WORLD = 101  # a tuning world of configs/tiny.yaml


@pytest.fixture(scope="module")
def bench() -> dict[str, Any]:
    """The benchmark's globals (run as a module under its own name, as a script would be)."""
    return runpy.run_path(str(REPO_ROOT / "benchmarks" / "bench_reader_probe.py"),
                          run_name="bench_reader_probe")


@pytest.fixture(scope="module")
def config() -> Any:
    return load_config(REPO_ROOT / "configs/tiny.yaml", [*SMALL, f"data.synthetic.seed={WORLD}"])


def test_a_demonstration_reads_the_gold_passages_and_writes_only_the_answer(
        bench: dict[str, Any], config: Any) -> None:
    world = generate_world(config.data.synthetic)
    by_id = {p.id: p for p in world.passages}
    for ex in world.splits["train"][:10]:
        demo = bench["reader_demo"](ex, by_id, config)
        context = "".join(text for text, trainable in demo.segments if not trainable)
        written = [text for text, trainable in demo.segments if trainable]
        assert written == [f" {ex.golden_answers[0]} </answer>"]
        assert context.endswith(ANSWER_OPEN) and "<search>" not in demo.text.split(
            "Question:")[1]
        for doc in ex.supporting_doc_ids:  # every gold passage, no search turn
            assert by_id[doc].contents in context


def test_the_gold_searcher_returns_every_gold_passage(bench: dict[str, Any],
                                                     config: Any) -> None:
    world = generate_world(config.data.synthetic)
    by_id = {p.id: p for p in world.passages}
    dev = world.splits["dev"]
    hits = bench["GoldSearcher"](dev, by_id).search_batch([ex.question for ex in dev], 1)
    assert [[h.doc_id for h in row] for row in hits] == [list(ex.supporting_doc_ids)
                                                         for ex in dev]


def test_slices_complement_where_they_should(bench: dict[str, Any], config: Any) -> None:
    dev = generate_world(config.data.synthetic).splits["dev"]
    answers = {normalize_answer(dev[0].golden_answers[0])}
    members = bench["slice_members"](dev, answers)
    everyone = set(range(len(dev)))
    for a, b in (("seen_phrasing", "unseen_phrasing"), ("seen_answer", "novel_answer")):
        assert set(members[a]) | set(members[b]) == everyone
        assert not set(members[a]) & set(members[b])
    assert 0 in members["seen_answer"]
    assert members["alias"] == [i for i, ex in enumerate(dev) if "alias" in ex.slices]


def test_the_learning_rate_warms_up_then_decays_to_zero(bench: dict[str, Any]) -> None:
    factor = bench["lr_factor"]
    assert 0 < factor(0.0, 10.0) < factor(0.4, 10.0) <= 1.0
    assert factor(9.0, 10.0) < factor(5.0, 10.0) and factor(10.0, 10.0) == pytest.approx(0.0)


def test_train_worlds_are_tuning_worlds_only(bench: dict[str, Any], config: Any) -> None:
    with pytest.raises(ValueError, match="tuning worlds only"):
        bench["probe"](config, budget_s=1.0, train_worlds=[WORLD, 5])  # 5: no tuning world


@pytest.mark.usefixtures("one_torch_thread")
def test_end_to_end_a_tiny_model_for_seconds(bench: dict[str, Any], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out, figures = tmp_path / "probe.md", tmp_path / "probe.json"
    argv = ["--model", "tiny", "--world-seed", str(WORLD), "--train-worlds", f"{WORLD},102",
            "--label", "tiny", "--out", str(out), "--lr", "3e-3", "--micro-batch", "4"]
    assert bench["main"]([*argv, "--budget-s", "1", "--dev-questions", "5", *SMALL]) == 0
    # A second candidate's row goes under the first's; the whole dev split this time.
    assert bench["main"]([*argv, "--budget-s", "2", "--json", str(figures), *SMALL]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 4 and "---" in lines[1]  # one header, two rows
    assert lines[0] in capsys.readouterr().out
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row = [c.strip() for c in lines[3].strip("|").split("|")]
    columns = bench["SLICE_COLUMNS"]
    assert [h.split(" (n=")[0] for h in header[-len(columns):]] == list(columns)
    assert row[0] == "tiny" and row[2] == "0.003"

    result = json.loads(figures.read_text())
    n, em = result["n"], result["em"]
    assert n["all"] == 30 and result["demos"] == 80 and result["train_worlds"] == [WORLD, 102]
    assert n["seen_phrasing"] + n["unseen_phrasing"] == n["all"]
    assert n["seen_answer"] + n["novel_answer"] == n["all"]
    for name in columns:
        assert 0 <= n[name] <= n["all"]
        assert math.isnan(em[name]) if n[name] == 0 else 0.0 <= em[name] <= 1.0
    run = result["run"]
    assert run["steps"] >= 1 and run["epochs"] > 0 and run["tokens_per_s"] > 0
    assert math.isfinite(run["final_loss"]) and result["lr"] == 3e-3


class PerfectReader:
    """Answers each question with its gold answer, after checking that the context holds
    every gold passage whole (what a reader could copy it from)."""

    def __init__(self, tokenizer: Any, dev: Any, passages: Any) -> None:
        self.tokenizer = tokenizer
        self.max_context_tokens = None
        self.gold = {ex.question: ex for ex in dev}
        self.passages = passages

    def release(self) -> None:
        return None

    def generate(self, contexts: Any, params: Any, **_: Any) -> list[GenerationOutput]:
        outs = []
        for ctx in contexts:
            text = self.tokenizer.decode(ctx)
            ex = self.gold[text.split("Question: ")[1].split("\n")[0]]
            assert text.endswith(ANSWER_OPEN)
            assert all(self.passages[d].contents in text for d in ex.supporting_doc_ids)
            ids = self.tokenizer(f" {ex.golden_answers[0]} </answer>",
                                 add_special_tokens=False)["input_ids"]
            outs.append(GenerationOutput(list(ids), [0.0] * len(ids), "stop"))
        return outs


def test_a_perfect_reader_scores_one_on_every_question(bench: dict[str, Any],
                                                       config: Any) -> None:
    world = generate_world(config.data.synthetic)
    by_id = {p.id: p for p in world.passages}
    tokenizer = train_tokenizer([p.contents for p in world.passages], 300)
    dev = world.splits["dev"]
    assert max(len(ex.supporting_doc_ids) for ex in dev) == 3  # more than the config's top_k
    em = bench["reader_em"](config, dev, by_id, PerfectReader(tokenizer, dev, by_id), 1024)
    assert em == [1.0] * len(dev)
