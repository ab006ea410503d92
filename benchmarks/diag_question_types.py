"""Per-question-type diagnostics of the synthetic world: why a type gets no training signal.

For each question type of the configured world (and of the cold start's extra worlds, whose
demonstrations are the tiny config's whole SFT set): questions per split, SFT demos built and
skipped because the searcher missed a chain passage (the demo builder's filter, at the
rollout's top_k), chain recall@1 / @3 of BM25 for the exact entity names the demos search,
the tokens of the `<information>` block the rollout inserts for the first hop (against
`rollout.info_token_budget`) and of the gold answer, and whether the answer survives EM
normalisation. Seconds on one core, no model, no training.

    .venv/bin/python benchmarks/diag_question_types.py [--config configs/tiny.yaml]
        [--rev a067391] [overrides...]

`--rev` takes the world generator (src/searchrl/datasets/synthetic.py) from that git commit, to
reproduce a past world (a067391: before the issue-25 fix, "New <org>" distractors).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from searchrl.config import PipelineConfig, SyntheticWorldConfig, load_config
from searchrl.models.tiny import train_tokenizer
from searchrl.retrieval.bm25 import BM25Index
from searchrl.retrieval.index_store import LocalSearcher
from searchrl.rl.prompts import build_prompt
from searchrl.text import normalize_answer
from searchrl.train.cold_start import demos as demos_module
from searchrl.train.cold_start.build import extra_world_seeds, information_block
from searchrl.types import Passage

ROOT = Path(__file__).resolve().parents[1]


def _generator(rev: str | None) -> Callable[[SyntheticWorldConfig], Any]:
    if rev is None:
        from searchrl.datasets.synthetic import generate_world
        current: Callable[[SyntheticWorldConfig], Any] = generate_world
        return current
    # searchrl/data/ is searchrl/datasets/ since issue 45: an older commit's file, and its
    # imports, under the old name
    for where in ("datasets", "data"):
        shown = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:src/searchrl/{where}/synthetic.py"],
            capture_output=True, text=True)
        if shown.returncode == 0:
            break
    shown.check_returncode()
    source = shown.stdout.replace("searchrl.data.", "searchrl.datasets.")
    path = Path(tempfile.mkdtemp()) / "synthetic_rev.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("synthetic_rev", path)
    assert spec is not None and spec.loader is not None
    module: ModuleType = importlib.util.module_from_spec(spec)
    sys.modules["synthetic_rev"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.generate_world  # type: ignore[no-any-return]


def _searcher(config: PipelineConfig) -> Callable[[Sequence[Passage]], LocalSearcher]:
    icfg = config.index.model_copy(update={"retriever": "bm25"})

    def make(passages: Sequence[Passage]) -> LocalSearcher:
        bm25 = BM25Index.build([p.contents for p in passages], k1=icfg.bm25_k1, b=icfg.bm25_b,
                               stopwords=icfg.bm25_stopwords)
        return LocalSearcher(passages, icfg, bm25=bm25)

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "tiny.yaml"))
    parser.add_argument("--rev", default=None, help="git commit of the world generator")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    generate = _generator(args.rev)
    demos_module.generate_world = generate  # the extra worlds come from the same generator
    wcfg, top_k = config.data.synthetic, config.rollout.top_k
    world = generate(wcfg)
    make = _searcher(config)
    searcher = make(world.passages)
    by_id = {p.id: p for p in world.passages}
    tok = train_tokenizer([p.contents for p in world.passages], config.model.tiny.vocab_size)

    rows: dict[str, dict[str, Any]] = {}
    splits = ("train", "test")
    titles = sorted({by_id[d].title or "" for s in splits for ex in world.splits[s]
                     for d in ex.supporting_doc_ids})
    hits = dict(zip(titles, searcher.search_batch(titles, max(3, top_k)), strict=True))
    for split in splits:
        for ex in world.splits[split]:
            row = rows.setdefault(ex.type or "?", {"n": Counter(), "r1": 0, "r3": 0, "info": [],
                                                   "ans": [], "norm_ok": 0})
            row["n"][split] += 1
            if split != "test":
                continue
            chain = [(by_id[d].title or "", d) for d in ex.supporting_doc_ids]
            row["r1"] += all(d in {h.doc_id for h in hits[t][:1]} for t, d in chain)
            row["r3"] += all(d in {h.doc_id for h in hits[t][:3]} for t, d in chain)
            first = information_block(hits[chain[0][0]][:top_k])
            row["info"].append(len(tok(first)["input_ids"]))
            answer = ex.golden_answers[0]
            row["ans"].append(len(tok(f" {answer} ")["input_ids"]))
            row["norm_ok"] += normalize_answer(answer) == " ".join(answer.lower().split())
    _, stats = demos_module.world_demos(
        wcfg, extra_world_seeds(config), make, n_demos=config.train.sft.extra_world_demos,
        prompt_fn=build_prompt, info_fn=information_block, top_k=top_k)

    budget = config.rollout.info_token_budget
    print(f"world seed {wcfg.seed}, generator {args.rev or 'working tree'}, top_k {top_k}, "
          f"info_token_budget {budget}; SFT demos from {len(extra_world_seeds(config))} extra "
          f"worlds: built {stats.built}, attempts skipped (chain not retrieved) "
          f"{stats.skipped_gold_not_retrieved}")
    print(f"{'type':30s} {'train':>5s} {'test':>4s} {'demos':>5s} {'skip':>5s} "
          f"{'rec@1':>5s} {'rec@3':>5s} {'info_tok':>8s} {'ans_tok':>7s} {'norm':>4s}")
    for qtype in sorted(rows):
        r = rows[qtype]
        n = r["n"]["test"]
        rec = f"{r['r1'] / n:5.2f} {r['r3'] / n:5.2f}" if n else f"{'-':>5s} {'-':>5s}"
        norm = f"{r['norm_ok'] / n:4.2f}" if n else f"{'-':>4s}"
        info = f"{statistics.median(r['info']):.0f}/{max(r['info'])}" if r["info"] else "-"
        ans = f"{statistics.mean(r['ans']):.1f}" if r["ans"] else "-"
        print(f"{qtype:30s} {r['n']['train']:5d} {r['n']['test']:4d} "
              f"{stats.by_type.get(qtype, 0):5d} {stats.not_retrieved_by_type.get(qtype, 0):5d} "
              f"{rec} {info:>8s} {ans:>7s} {norm}")
    print("rec@k: test questions whose every chain passage BM25 returns in the top k for the "
          "entity's exact name; info_tok: median/max tokens of the first hop's <information> "
          "block (tiny tokenizer on the corpus); norm: answers unchanged by EM normalisation "
          "beyond case")


if __name__ == "__main__":
    main()
