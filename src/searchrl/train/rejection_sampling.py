"""Rejection sampling ("RFT"), Search-R1's cheapest alternative to RL: the SFT cold start
fine-tuned on its own correct, well-formed rollouts of the training questions. Evaluated as
the `rejection_sampling` system beside `sft` and `trained`; never the policy GRPO starts from.

Samples. The curriculum stage already draws `curriculum.samples_per_question` rollouts of the
same cold start, at `rollout.temperature`, on the questions it estimates, and keeps the usable
ones in `correct_samples.jsonl` (`write_estimate_samples`). They are reused whenever they come
from this cold start with these rollout settings: for each question the first
`samples_per_question` of its samples (the group's draws are independent, so any k of them are
k samples). Questions the estimate did not cover (beyond `curriculum.max_questions`), or every
question when `samples_per_question` asks for more than it drew, are sampled here with the same
rollout loop (`run_rollouts`, the generator from `make_generator`).

Fine-tune. The SFT trainer (`run_sft`) on the kept rollouts' own token ids with the rollout's
loss mask: 1 only on sampled tokens, 0 on the prompt, the inserted `<information>` blocks and
the template's glue. Nothing is re-tokenised, so the mask is exactly the one GRPO trains with.

Cached like the cold start: a key file (config inputs, the start's key, the questions' and the
reused samples' content, the code) is written last, and a matching one means the policy in the
directory is reused as is.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.codehash import code_fingerprint
from searchrl.config import PipelineConfig, inputs_of
from searchrl.datasets.io import (
    atomic_write_text,
    fingerprint,
    read_manifest,
    records_fingerprint,
    write_jsonl,
)
from searchrl.generation.factory import load_policy_on_device, make_generator
from searchrl.retrieval.base import Searcher
from searchrl.rl.records import RolloutRecord
from searchrl.rl.rollout import run_rollouts
from searchrl.sinks import MetricsSink, NullSink
from searchrl.train.cold_start.build import SFT_KEY_FILE
from searchrl.train.cold_start.sft import TokenizedDemo, run_sft, save_policy
from searchrl.train.seeds import seed_everything
from searchrl.types import QAExample

log = logging.getLogger(__name__)

RS_DIR = "rejection_sampling"  # under the train stage's dir, beside sft/ and policy/
RS_KEY_FILE = "searchrl_rs.json"
RS_STATS_FILE = "searchrl_rs_stats.json"
SAMPLES_FILE = "correct_samples.jsonl"  # the curriculum estimate's usable samples


def usable(record: RolloutRecord) -> bool:
    """A sample rejection sampling keeps: correct (binary EM), well formed by the policy
    itself (the format part the evaluation's `format_ok` reads: a template-forced answer has
    none) and with no failed search (its `<information>` block is an error message, not
    what the retriever returns)."""
    return (record.correct and record.reward_parts.get("format", 0.0) >= 1.0
            and record.search_errors == 0)


def rollout_demo(record: RolloutRecord) -> TokenizedDemo:
    """The rollout as an SFT example: prompt + response token ids, the loss on exactly the
    tokens the rollout's mask marks as sampled."""
    if len(record.loss_mask) != len(record.response_ids):
        raise ValueError(f"rollout {record.example_id}#{record.sample_index}: loss_mask has "
                         f"{len(record.loss_mask)} entries for {len(record.response_ids)} "
                         "response tokens")
    return TokenizedDemo(list(record.prompt_ids) + list(record.response_ids),
                         [0] * len(record.prompt_ids) + [int(m) for m in record.loss_mask])


def select_samples(records: Sequence[RolloutRecord]) -> list[RolloutRecord]:
    """The usable records, each distinct trajectory of a question once: at T < 1 an easy
    question's samples are often the same tokens, and repeats would weight the questions the
    policy already solves every time over those it solves once."""
    seen: set[tuple[str, tuple[int, ...]]] = set()
    out: list[RolloutRecord] = []
    for record in records:
        key = (record.example_id, tuple(record.response_ids))
        if usable(record) and key not in seen:
            seen.add(key)
            out.append(record)
    return out


# --- the curriculum estimate's samples, kept for reuse


def start_key(policy_dir: Path) -> str:
    """The identity of a cold-start policy: its key file's text ("" when it has none)."""
    path = Path(policy_dir) / SFT_KEY_FILE
    return path.read_text() if path.is_file() else ""


def sampling_inputs(config: PipelineConfig) -> dict[str, Any]:
    """The rollout settings a sample depends on: those the curriculum's estimate declares
    (the same samples: same policy, loop and temperature)."""
    return inputs_of(config.rollout, "filter_curriculum")


def write_estimate_samples(path: Path, records: Sequence[RolloutRecord], *, policy_dir: Path,
                           config: PipelineConfig) -> Path:
    """The estimate's samples as rejection sampling needs them (`path`, JSONL + manifest):
    a header row (the policy's key, the rollout settings), then per estimated question, in
    order, its sample count and its usable samples' token ids and loss masks. Only usable
    samples are stored: the file stays a fraction of the rollouts' size."""
    by_id: dict[str, list[RolloutRecord]] = {}
    for record in records:
        by_id.setdefault(record.example_id, []).append(record)
    rows: list[dict[str, Any]] = [{"policy": start_key(policy_dir),
                                   "sampling": sampling_inputs(config)}]
    for example_id, group in by_id.items():
        rows.append({"example_id": example_id, "samples": len(group),
                     "kept": [{"sample_index": r.sample_index, "prompt_ids": r.prompt_ids,
                               "response_ids": r.response_ids, "loss_mask": r.loss_mask}
                              for r in group if usable(r)]})
    write_jsonl(path, rows)
    return path


# (samples drawn per question id, its usable samples); a tuple, not a dataclass of this
# module: `code_fingerprint` reads the source of what the keyed code refers to here, and a
# dataclass's generated methods have none.
EstimateSamples = tuple[dict[str, int], dict[str, list[RolloutRecord]]]


def read_estimate_samples(path: Path | None, *, policy_dir: Path, config: PipelineConfig
                          ) -> EstimateSamples | None:
    """The estimate's samples (drawn per question, usable ones) when they were drawn from
    this policy with these rollout settings; None otherwise (missing, incomplete: no
    manifest, or another start)."""
    if path is None or not Path(path).is_file() or read_manifest(path) is None:
        return None
    with Path(path).open(encoding="utf-8") as fh:
        header = json.loads(fh.readline())
        if (header.get("policy") != start_key(policy_dir) or not header.get("policy")
                or header.get("sampling") != sampling_inputs(config)):
            return None
        drawn: dict[str, int] = {}
        kept: dict[str, list[RolloutRecord]] = {}
        for line in fh:
            row = json.loads(line)
            drawn[row["example_id"]] = int(row["samples"])
            kept[row["example_id"]] = [RolloutRecord(
                example_id=row["example_id"], sample_index=int(s["sample_index"]),
                prompt_ids=s["prompt_ids"], response_ids=s["response_ids"],
                loss_mask=s["loss_mask"], old_logprobs=[], text="", turns=0, correct=True,
                reward_parts={"format": 1.0}) for s in row["kept"]]
    return drawn, kept


# --- the system


@dataclass(frozen=True)
class RejectionSamplingResult:
    policy_dir: Path
    seconds: float  # wall time of the build (a reused policy: as recorded when it was built)
    built: bool  # False: reused from an earlier run
    metrics: dict[str, float] = field(default_factory=dict)


def build_rejection_sampling(config: PipelineConfig, questions: Sequence[QAExample],
                             sft_dir: Path, searcher: Searcher, out_dir: Path, *,
                             samples_path: Path | None = None, sink: MetricsSink | None = None,
                             progress: bool = True) -> RejectionSamplingResult:
    """The SFT policy in `sft_dir` fine-tuned on its correct, well-formed samples of the first
    `train.rejection_sampling.max_questions` of `questions`, saved (model + tokenizer) in
    `out_dir`. `samples_path`: the curriculum estimate's samples, reused where they apply.

    Metrics (returned and recorded with the policy): rs_questions, rs_samples, rs_correct
    (usable samples), rs_kept (distinct ones trained on), rs_questions_with_a_correct_sample,
    rs_reused_questions / rs_sampled_questions, rs_steps, rs_final_loss; the per-step loss is
    logged to `sink` as rs_loss while it trains. With no usable sample the start is saved
    unchanged (RFT with nothing to learn from is the SFT policy), with a warning.
    """
    seconds, metrics, built = _build(config, questions, sft_dir, searcher, out_dir,
                                     samples_path=samples_path, sink=sink or NullSink(),
                                     progress=progress)
    return RejectionSamplingResult(out_dir, seconds, built=built, metrics=metrics)


def _build(config: PipelineConfig, questions: Sequence[QAExample], sft_dir: Path,
           searcher: Searcher, out_dir: Path, *, samples_path: Path | None, sink: MetricsSink,
           progress: bool) -> tuple[float, dict[str, float], bool]:
    """`build_rejection_sampling`'s work: (seconds, metrics, built); its code is the key's."""
    cfg = config.train.rejection_sampling
    k = cfg.samples_per_question
    chosen = list(questions)[: cfg.max_questions]
    reuse = read_estimate_samples(samples_path, policy_dir=sft_dir, config=config)
    covered = [q for q in chosen if reuse is not None and reuse[0].get(q.id, 0) >= k]
    key = {"config": {"rejection_sampling": inputs_of(cfg, "train_policy"),
                      "sampling": sampling_inputs(config), "seed": config.run.seed},
           "start": start_key(sft_dir), "questions": records_fingerprint(chosen),
           # Which questions reuse samples follows from the file, `questions` and k.
           "reused": fingerprint(samples_path) if covered and samples_path else None,
           "code": code_fingerprint(_build)}
    key_file = out_dir / RS_KEY_FILE
    if key_file.is_file() and json.loads(key_file.read_text()) == key:
        stats = json.loads((out_dir / RS_STATS_FILE).read_text())
        return float(stats["seconds"]), stats["metrics"], False
    started = time.perf_counter()
    seed_everything(config.run.seed)
    covered_ids = {q.id for q in covered}
    records: list[RolloutRecord] = []
    for q in covered:
        assert reuse is not None
        records += [r for r in reuse[1][q.id] if r.sample_index < k]
    fresh = [q for q in chosen if q.id not in covered_ids]
    # Loaded once: the hf backend samples with this model, which is then fine-tuned, both on
    # run.device.
    model, tokenizer = load_policy_on_device(config, sft_dir)
    if fresh:
        model.train(False)
        generator = make_generator(config, policy_dir=sft_dir, model=model, tokenizer=tokenizer)
        records += run_rollouts(fresh, generator, searcher, config.rollout, config.reward,
                                group_size=k, seed=config.run.seed).records
    correct = [r for r in records if usable(r)]
    kept = select_samples(records)
    # The cold start's SFT settings (batch, micro-batch, clipping), RS's epochs and rate; the
    # loss on the policy's tokens only: no language modelling of prompts and passages.
    sft_cfg = config.train.sft.model_copy(
        update={"epochs": cfg.epochs, "lr": cfg.lr, "context_loss_weight": 0.0})
    metrics = {"rs_questions": float(len(chosen)), "rs_samples": float(len(chosen) * k),
               "rs_correct": float(len(correct)), "rs_kept": float(len(kept)),
               "rs_questions_with_a_correct_sample": float(len({r.example_id for r in kept})),
               "rs_reused_questions": float(len(covered)),
               "rs_sampled_questions": float(len(fresh))}
    if kept:
        result = run_sft(model, tokenizer, [rollout_demo(r) for r in kept], sft_cfg,
                         seed=config.run.seed, progress=progress,
                         on_step=lambda s, loss: sink.log_metrics({"rs_loss": loss}, step=s))
        metrics |= {"rs_steps": float(result.steps), "rs_final_loss": result.losses[-1]}
    else:
        log.warning("rejection sampling: none of %.0f samples on %d questions is correct and "
                    "well formed; the SFT policy is saved unchanged", metrics["rs_samples"],
                    len(chosen))
        metrics |= {"rs_steps": 0.0}
    save_policy(model, tokenizer, out_dir)
    seconds = time.perf_counter() - started
    metrics = {k_: v for k_, v in metrics.items() if math.isfinite(v)}
    atomic_write_text(out_dir / RS_STATS_FILE,
                      json.dumps({"seconds": seconds, "metrics": metrics}))
    atomic_write_text(key_file, json.dumps(key))  # last: a half-built dir is never reused
    return seconds, metrics, True
