"""benchmarks/bench_copy_fresh_worlds.py: which slots it scores, and that its comparison is
paired (a policy against itself differs by exactly nothing)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from transformers import AutoTokenizer

from searchrl.config import TinyModelConfig, load_config
from searchrl.datasets.synthetic import generate_world
from searchrl.models.tiny import build_tiny_model, train_tokenizer
from searchrl.train.cold_start.build import bm25_searcher, demo_kwargs, extra_world_seeds
from searchrl.train.cold_start.demos import world_demos
from searchrl.train.cold_start.sft import save_policy
from tests.conftest import REPO_ROOT
from tests.train_fixture import TINY, tiny_config

WORLD = ["data.synthetic.n_people=60", "data.synthetic.n_organisations=15",
         "data.synthetic.n_train=60", "data.synthetic.n_dev=10", "data.synthetic.n_test=20"]


def _bench() -> ModuleType:
    path = REPO_ROOT / "benchmarks" / "bench_copy_fresh_worlds.py"
    spec = importlib.util.spec_from_file_location("bench_copy_fresh_worlds", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained tiny policy with room for the tiny config's 3-hop contexts."""
    out = tmp_path_factory.mktemp("copy") / "policy"
    world = generate_world(tiny_config(Path("/tmp")).data.synthetic)
    tok = train_tokenizer([p.contents for p in world.passages], vocab_size=TINY["vocab_size"])
    model = build_tiny_model(TinyModelConfig(**{**TINY, "n_positions": 1024}), tok, seed=0)
    save_policy(model, tok, out)
    return out


def test_slots_are_the_gold_chains_queries_then_its_answer(policy: Path) -> None:
    config = load_config(REPO_ROOT / "configs/tiny.yaml", WORLD)
    demos, _ = world_demos(config.data.synthetic, extra_world_seeds(config, first=30, count=1),
                           bm25_searcher(config), n_demos=20,
                           **demo_kwargs(config, gold_only=True))
    tokenizer = AutoTokenizer.from_pretrained(policy)
    slots = _bench()._slots(demos, tokenizer, config.train.sft.max_len)
    for i, demo in enumerate(demos):
        mine = [s for s in slots if s.demo == i]
        queries = [s.gold for s in mine if s.kind == "query"]
        assert [s.kind for s in mine] == ["query"] * demo.hops + ["answer"]
        assert mine[-1].gold == demo.answer and mine[-1].qtype == demo.qtype
        # Each query is the name the demonstration searched, in order.
        assert queries == [seg.split("<search>")[1].split("</search>")[0].strip()
                           for seg, trainable in demo.segments if trainable and "<search>" in seg]
        # The context ends with the opener the policy wrote; the gold text is not in it.
        assert mine[-1].context[-1] == tokenizer.convert_tokens_to_ids("<answer>")


def test_a_policy_against_itself_differs_by_nothing(policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "copy.md"
    assert _bench().main(["--policy", f"a={policy}", "--policy", f"b={policy}", "--worlds", "1",
                          "--per-type", "3", "--out", str(out), *WORLD]) == 0
    rows = [line.split(" | ") for line in out.read_text().splitlines()
            if line.startswith("| ") and "---" not in line][1:]
    assert {r[0].lstrip("| ") for r in rows} >= {"org_founder", "person_birth_country", "all"}
    for row in rows:
        assert row[-1].rstrip(" |") == "+0.000 [+0.000, +0.000]"
        if row[1] == "answer" and row[0] != "| all":
            assert 1 <= int(row[2]) <= 3
