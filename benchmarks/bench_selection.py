"""Which GRPO checkpoint to hand on (issue 43): the evidence recipe on tuning worlds with every
5th step's checkpoint kept, each checkpoint and the SFT start evaluated greedily on the whole
dev split and on the test split, and the selection rules compared on what they pick.

    .venv/bin/python benchmarks/bench_selection.py [--world-seeds 101 102]
        [--work runs/selection] [--out FILE] [--config configs/prior.yaml] [overrides]

Per world: `flows/pipeline.py` with the evidence recipe (bench_sealed.EVIDENCE_RECIPE), no
early stopping, and a checkpoint kept every 5 steps (a finished run under --work is read, not
run again, while it is this config's and code's: benchmarks/pipeline_runs.py); then every
checkpoint's greedy answers on dev and test (cached in `<run>/selection.json`, each keyed by
the checkpoint's weights, the rollout and reward settings and the rollout code, so an answer
never outlives what made it). Rules: the trainer's dev evaluation as it was
(the first `train.eval_questions` dev questions, steps only, early stop after 2 without a new
best), with the start as a candidate (the trainer now), each without early stopping and on the
whole dev split, the last step, and the checkpoint best on test (an oracle, for scale). For
each: the step picked, its dev gain over the start as the rule saw it, and its test EM against
the start's (paired).
Tuning worlds only: this chooses how to select.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from bench_sealed import EVIDENCE_RECIPE, run_seed
from tqdm import tqdm

from searchrl.codehash import code_fingerprint
from searchrl.config import PipelineConfig, load_config
from searchrl.datasets.io import content_sha256, read_qa
from searchrl.datasets.tuning import require_tuning_world
from searchrl.eval.metrics import paired_bootstrap_delta
from searchrl.generation.factory import make_generator
from searchrl.retrieval.provider import searchers_for
from searchrl.rl.rollout import run_rollouts
from searchrl.train.grpo.checkpoint import STEP_PREFIX

STUDY = ("train.early_stop_patience=0", "train.checkpoint_every=5", "train.keep_checkpoints=100")
PATIENCE = 2  # configs/prior.yaml's train.early_stop_patience, replayed on the dev curves
Answers = dict[str, dict[str, dict[str, float]]]  # step -> split -> question id -> EM


@cache
def _rollout_code() -> str:
    return str(code_fingerprint(run_rollouts))  # once per process, not per checkpoint


def answers_key(config: PipelineConfig, weights: Path) -> str:
    """What a checkpoint's greedy answers depend on: its weights, the rollout and reward
    settings, and the rollout code (the searcher's index is the run's own)."""
    sections = config.to_dict()
    settings = json.dumps({k: sections[k] for k in ("rollout", "reward", "index")},
                          sort_keys=True, default=str)
    return hashlib.sha256(f"{content_sha256(weights)}|{settings}|{_rollout_code()}".encode()
                          ).hexdigest()


def evaluate_checkpoints(config: PipelineConfig, run: Path) -> Answers:
    """Greedy EM per dev and test question of the SFT start (step 0) and every checkpoint."""
    cache = run / "selection.json"
    stored: dict[str, Any] = json.loads(cache.read_text()) if cache.is_file() else {}
    out: Answers = {}
    index = json.loads((run / "build_index" / "ref.json").read_text())["index_dir"]
    searcher = searchers_for(config, None).searcher(index)
    splits = {s: read_qa(run / "validate_gold_labels" / f"{s}.jsonl") for s in ("dev", "test")}
    train_dir = run / "train_policy"
    policies = {"0": train_dir / "sft"} | {
        str(int(p.name.removeprefix(STEP_PREFIX))): p
        for p in sorted((train_dir / "checkpoints").glob(f"{STEP_PREFIX}*"))}
    with tempfile.TemporaryDirectory() as tmp:
        for step, src in tqdm(policies.items(), desc=f"checkpoints of {run.name}"):
            key = answers_key(config, src / "model.safetensors")
            if stored.get(step, {}).get("key") == key:
                out[step] = stored[step]["answers"]
                continue
            policy = src
            if step != "0":  # a checkpoint's weights with the start's config and tokenizer
                policy = Path(tmp) / step
                shutil.copytree(train_dir / "sft", policy)
                shutil.copy(src / "model.safetensors", policy / "model.safetensors")
            generator = make_generator(config, policy_dir=policy)
            out[step] = {}
            for split, examples in splits.items():
                batch = run_rollouts(examples, generator, searcher, config.rollout,
                                     config.reward, group_size=1, greedy=True, seed=0)
                out[step][split] = {r.example_id: float(r.correct) for r in batch.records}
            stored[step] = {"key": key, "answers": out[step]}
            cache.write_text(json.dumps(stored))
    return out


def pick(curve: dict[int, float], *, with_start: bool, patience: int) -> int:
    """The step keep-best hands on: the first best of `curve` (ties keep the earlier step),
    ending once `patience` evaluations in a row have not beaten it (0: never)."""
    best: int | None = None
    since = 0
    for step in sorted(curve):
        if step == 0 and not with_start:
            continue
        if best is None or curve[step] > curve[best]:
            best, since = step, 0
        else:
            since += 1
        if patience and since >= patience:
            break
    assert best is not None
    return best


def table(world: int, answers: Answers, dev_ids: list[str], eval_questions: int) -> str:
    steps = sorted(int(s) for s in answers)
    test_ids = sorted(answers["0"]["test"])

    def em(step: int, split: str, ids: list[str]) -> float:
        return sum(answers[str(step)][split][i] for i in ids) / len(ids)

    few = {s: em(s, "dev", dev_ids[:eval_questions]) for s in steps}
    whole = {s: em(s, "dev", dev_ids) for s in steps}
    test = {s: em(s, "test", test_ids) for s in steps}
    rules: dict[str, tuple[dict[int, float], int]] = {
        f"dev {eval_questions}, steps only (the trainer before)":
            (few, pick(few, with_start=False, patience=PATIENCE)),
        f"dev {eval_questions}, the start a candidate (the trainer now)":
            (few, pick(few, with_start=True, patience=PATIENCE)),
        f"dev {eval_questions}, the start a candidate, no early stop":
            (few, pick(few, with_start=True, patience=0)),
        f"dev {len(dev_ids)}, the start a candidate":
            (whole, pick(whole, with_start=True, patience=PATIENCE)),
        f"dev {len(dev_ids)}, the start a candidate, no early stop":
            (whole, pick(whole, with_start=True, patience=0)),
        "the last step": (whole, steps[-1]),
        "the best on test (an oracle)": (whole, max(steps, key=lambda s: test[s])),
    }
    start = [answers["0"]["test"][i] for i in test_ids]
    lines = [f"World {world}: greedy EM by step (0: the SFT start)", "",
             f"| step | dev {eval_questions} | dev {len(dev_ids)} | test {len(test_ids)} |",
             "|---|---|---|---|"]
    lines += [f"| {s} | {few[s]:.3f} | {whole[s]:.3f} | {test[s]:.3f} |" for s in steps]
    lines += ["", "| rule | step | dev gain over the start, as the rule saw it | test EM | "
              "test - start, paired |", "|---|---|---|---|---|"]
    for name, (curve, step) in rules.items():
        d = paired_bootstrap_delta([answers[str(step)]["test"][i] for i in test_ids], start,
                                   seed=0)
        lines.append(f"| {name} | {step} | {curve[step] - curve[0]:+.3f} | {test[step]:.3f} | "
                     f"{d.mean:+.3f} [{d.lo:+.3f}, {d.hi:+.3f}] |")
    return "\n".join(lines)


def main(argv: list[str] | None = None,
         run_world: Callable[[str, int, Path, list[str]], float | None] = run_seed) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-seeds", type=int, nargs="+", default=[101, 102])
    parser.add_argument("--work", type=Path, default=Path("runs/selection"))
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--config", default="configs/prior.yaml")
    args, extra = parser.parse_known_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    parts = []
    for world in args.world_seeds:
        overrides = [f"data.synthetic.seed={world}", *EVIDENCE_RECIPE, *STUDY, *extra]
        config = load_config(args.config, overrides)
        require_tuning_world(config)
        work = args.work / f"world{world}"
        run = work / "seed0"  # bench_sealed's layout: run seed 0
        run_world(args.config, 0, work, overrides)  # a finished, current run stands
        config = load_config(args.config, [*overrides, f"run.work_dir={run}"])
        answers = evaluate_checkpoints(config, run)
        dev_ids = [e.id for e in read_qa(run / "validate_gold_labels" / "dev.jsonl")]
        parts.append(table(world, answers, dev_ids, config.train.eval_questions))
    text = "\n\n".join(parts)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
