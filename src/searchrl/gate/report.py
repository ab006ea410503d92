"""Stage 6 library entry: evaluation results + the stages' recorded wall time and devices +
config -> the gate decision and its report files. Never raises on bad numbers: anything missing
or non-finite reaches the gate as None/NaN and fails closed there, named in the report.

Writes under `out_dir`: report.html, report.md, decision.json (atomically; decision.json last).

Over 400 lines because every figure the decision rests on is derived here, beside the gate that
reads it (comparator, champion, script, provenance, slices, stage costs, charged hours); the
cost model and the conditions are gate/payback.py (pure), the rendering gate/render.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from searchrl.config import PipelineConfig
from searchrl.datasets.io import atomic_write_text, read_manifest
from searchrl.eval.audit import GOLD_LIKELY_WRONG
from searchrl.eval.baselines import CHAMPION, FRONTIER, TRAINED
from searchrl.eval.metrics import NAN_INTERVAL, Interval, QuestionResult, Summary
from searchrl.eval.results import EvalResult, known_slice_card, read_question_results
from searchrl.gate.payback import (
    ChampionInputs,
    Check,
    CostInputs,
    GateInputs,
    GateResult,
    GateThresholds,
    Projection,
    StageCost,
    decide,
    project_training,
    total_device_hours,
)
from searchrl.gate.render import ReportInputs, render_html, render_markdown
from searchrl.gate.slices import SliceReport, compute_slices
from searchrl.generation.factory import resolve_device
from searchrl.types import CheckpointRef, CurriculumRef, EvalRef


@dataclass(frozen=True)
class GateOutcome:
    result: GateResult
    report: ReportInputs
    html_path: Path
    md_path: Path
    decision_path: Path
    figures: dict[str, float]


def count_rows(path: str | Path | None) -> int | None:
    """Rows of a JSONL dataset file (from its manifest when valid); None when unreadable."""
    if path is None or not Path(path).is_file():
        return None
    manifest = read_manifest(path)
    if manifest is not None:
        return int(manifest["rows"])
    with Path(path).open(encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())


def load_training_curve(path: str | Path | None, metrics: tuple[str, ...]
                        ) -> dict[str, list[tuple[int, float]]]:
    """Per-step values of the wanted metrics from the trainer's metrics JSONL.

    A key matches metric `m` when it equals `m` or ends with `/m` or `.m` (trainers prefix
    names). Unreadable lines and non-finite values are skipped: the plot is context, not a
    gate input. A missing file gives an empty curve (the plot says so).
    """
    curve: dict[str, list[tuple[int, float]]] = {}
    for i, row in enumerate(_metric_rows(path)):
        step = row.get("step", i)
        for key, value in row.items():
            if not isinstance(value, int | float) or not math.isfinite(value):
                continue
            if any(key == m or key.endswith((f"/{m}", f".{m}")) for m in metrics):
                curve.setdefault(key, []).append((int(step), float(value)))
    return curve


def _metric_rows(path: str | Path | None) -> Iterator[dict[str, Any]]:
    """The JSON-object lines of the trainer's metrics JSONL (none when it is missing;
    unreadable lines skipped: the report's context, never a reason to fail)."""
    if path is None or not Path(path).is_file():
        return
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                yield row


# The learned systems without RL: what "without RL" means when no frontier is measured. The
# stronger of those evaluated is the `best` comparator: the question the gate answers is
# whether RL pays beyond fine-tuning the same model on demonstrations (sft) or on its own
# correct samples (rejection_sampling).
SCRIPTED, REJECTION_SAMPLING = "scripted", "rejection_sampling"
SFT_FAMILY = ("sft", REJECTION_SAMPLING)
# The decision box lists the systems in this order (any other evaluated system after them).
DISPLAY_ORDER = ("no_search", "retrieve_once", SCRIPTED, "sft", REJECTION_SAMPLING, TRAINED,
                 CHAMPION, FRONTIER)
SYSTEM_ROLES = {"no_search": "cold start (SFT policy, or the base model with SFT off), answers "
                             "without retrieval",
                "retrieve_once": "cold start (SFT policy, or the base model with SFT off), top-k "
                                 "passages once, then answers",
                SCRIPTED: "the strongest fixed program we ship, no learning",
                "sft": "fine-tuned on demonstrations, no RL",
                REJECTION_SAMPLING: "fine-tuned on its own correct samples, no RL",
                TRAINED: "GRPO-trained (RL): the candidate",
                CHAMPION: "the registry's current champion",
                FRONTIER: "the frontier model (endpoint)",
                "base_agentic": "the base model before any training"}


def choose_baseline(evaluation: EvalResult, wanted: str) -> tuple[str, list[str]]:
    """The baseline the accuracy condition compares with, and notes.

    `best`: the stronger by EM of the evaluated learned systems without RL (`SFT_FAMILY`:
    sft, rejection_sampling). Never a fixed program or prompt format (scripted, no_search,
    retrieve_once: beating those says nothing about RL over fine-tuning), nor the registry's
    champion (what the policy would replace, judged by the champion check's non-inferiority:
    with it as the bar, every week after the first GO had to beat it by a margin). With no
    SFT-family system evaluated `best` is returned as is, and the gate fails closed on it
    rather than fall back to another system. A named baseline is used as named; one that was
    not evaluated is returned as is and fails closed too.
    """
    baselines = {n: s for n, s in evaluation.systems.items() if n != TRAINED}
    if wanted != "best":
        if wanted not in baselines:
            return wanted, [f"gate.comparison_baseline={wanted!r} was not evaluated "
                            f"(evaluated: {sorted(baselines)}): accuracy cannot be checked"]
        return wanted, []
    family = {n: baselines[n].summary.em.mean for n in SFT_FAMILY if n in baselines}
    if not family:
        return "best", [f"gate.comparison_baseline=best: no learned system without RL "
                        f"({', '.join(SFT_FAMILY)}) was evaluated (evaluated: "
                        f"{sorted(baselines)}): accuracy cannot be checked; add one to "
                        "eval.baselines, or name a baseline in gate.comparison_baseline"]
    finite = {n: em for n, em in family.items() if math.isfinite(em)}
    if not finite:
        return "best", [f"no SFT-family system ({', '.join(sorted(family))}) has a finite "
                        "EM: accuracy cannot be checked"]
    best = max(sorted(finite), key=lambda n: finite[n])
    return best, [f"comparison baseline: {best}, the best SFT-family system without RL: the "
                  f"stronger by EM of {_ems(family)} (gate.comparison_baseline=best; "
                  "scripted, no_search, retrieve_once and the champion are never chosen "
                  "by it)"]


def _ems(ems: Mapping[str, float]) -> str:
    """`sft 0.300, rejection_sampling 0.420` in `SFT_FAMILY` order."""
    return ", ".join(f"{n} {em:.3f}" if math.isfinite(em) else f"{n} n/a"
                     for n, em in ems.items())


@dataclass(frozen=True)
class Comparator:
    """What the accuracy condition compares the trained policy with, and what the payback
    condition charges for the frontier: measured (the `frontier` system) or a stand-in."""

    name: str
    kind: Literal["frontier", "stand-in"]
    sentence: str  # for the decision box
    problem: str | None  # why it was not fully measured (fails the accuracy condition)
    tokens_per_query: float
    price_per_1k_tokens: float
    tokens_source: str
    notes: tuple[str, ...] = ()


def comparator_of(config: PipelineConfig, evaluation: EvalResult) -> Comparator:
    """The frontier system when `eval.frontier` is configured (its measured EM, tokens per
    query from the endpoint's usage, priced with eval.frontier's prices); otherwise the
    `gate.comparison_baseline` stand-in with the assumed gate.frontier_* cost figures."""
    g, cfg = config.gate, config.eval.frontier
    measured = evaluation.systems.get(FRONTIER)
    if cfg is None and measured is None:
        name, notes = choose_baseline(evaluation, g.comparison_baseline)
        verdict = ("may pass: gate.allow_stand_in_comparator=true" if
                   g.allow_stand_in_comparator else
                   "may not pass: gate.allow_stand_in_comparator=false")
        found = name in evaluation.systems and name != TRAINED
        problem = None if found else (notes[0] if notes else f"{name} was not evaluated")
        if not found:
            what = f"{name}, NOT evaluated ({problem}), so the accuracy condition fails"
        elif g.comparison_baseline == "best":
            family = {n: evaluation.systems[n].summary.em.mean for n in SFT_FAMILY
                      if n in evaluation.systems}
            what = (f"best SFT-family system without RL: {name} (the stronger by EM of "
                    f"{_ems(family)})")
        else:
            what = f"{name} (named by gate.comparison_baseline)"
        return Comparator(
            name, "stand-in",
            f"Comparator: {what}, a stand-in, NOT the frontier system (no eval.frontier "
            "endpoint is configured, so the frontier's accuracy was not measured); the "
            f"accuracy condition is measured against the stand-in and {verdict}. The frontier's "
            "cost is assumed (gate.frontier_tokens_per_query, gate.frontier_price_per_1k_tokens).",
            problem, g.frontier_tokens_per_query, g.frontier_price_per_1k_tokens,
            "assumed: gate.frontier_tokens_per_query", tuple(notes))
    if measured is None:
        problem = ("eval.frontier is configured but the evaluation has no frontier system; "
                   "re-run evaluate_policy")
        return Comparator(FRONTIER, "frontier", f"Comparator: the frontier system, NOT "
                          f"measured: {problem}.", problem, math.nan, math.nan, "not measured")
    s = measured.summary
    prompt = s.tokens_per_query - s.response_tokens
    if cfg is not None:  # blended: what one measured query costs, per 1k of its tokens
        cost = (prompt * cfg.price_per_1k_prompt_tokens
                + s.response_tokens * cfg.price_per_1k_completion_tokens)
        price = cost / s.tokens_per_query if s.tokens_per_query > 0 else math.nan
        priced = (f"priced at {cfg.price_per_1k_prompt_tokens:g} / "
                  f"{cfg.price_per_1k_completion_tokens:g} per 1k prompt / completion tokens")
    else:
        price = g.frontier_price_per_1k_tokens
        priced = "priced at gate.frontier_price_per_1k_tokens"
    incomplete = measured.incomplete
    sentence = (f"Comparator: the frontier system, {measured.spec.description}, measured on the "
                f"same eval set with the same retriever and prompt: EM {s.em.mean:.3f}, "
                f"{s.tokens_per_query:.0f} tokens/query from the endpoint's usage, {priced}.")
    if incomplete:
        sentence += f" INCOMPLETE: {incomplete}."
    return Comparator(FRONTIER, "frontier", sentence, incomplete, s.tokens_per_query, price,
                      "measured: endpoint usage, the prompt re-sent every turn")




def champion_inputs(config: PipelineConfig, evaluation: EvalResult,
                    registered: str | None) -> ChampionInputs | None:
    """What the non-inferiority condition compares: the champion's paired delta from the
    evaluation, or why it is missing. `registered` is the version the registry's champion
    alias points at (None: none registered, or no registry reachable)."""
    delta = evaluation.deltas.get(CHAMPION)
    if delta is not None:
        return ChampionInputs(registered or "evaluated", delta.mean, delta.lo, delta.hi)
    if registered is None:
        return None
    if CHAMPION not in config.eval.baselines:
        why = "eval.baselines omits champion: add it and re-run evaluate_policy"
    else:
        why = ("the evaluation has no champion system (it ran before this champion was "
               "registered): re-run evaluate_policy")
    return ChampionInputs(registered, problem=why)


def champion_sentence(champion: ChampionInputs | None, margin: float) -> str:
    """For the decision box."""
    if champion is None:
        return ("Champion: none registered yet, so the non-inferiority condition has nothing "
                "to compare with (passes).")
    if champion.problem:
        return f"Champion: version {champion.version}, NOT compared: {champion.problem}."
    return (f"Champion: version {champion.version}, measured on the same questions; GO requires "
            f"the paired EM delta's lower bound >= -{margin:.3f} (gate.champion_margin), so a "
            "GO never replaces a stronger champion.")


def start_sentence(config: PipelineConfig) -> str:
    """What training started from (train.init), and so what the charged cost covers."""
    if config.train.init == "champion":
        return (f"Training continued from the registry's champion "
                f"({config.registry_model_name}@{config.eval.champion_alias}, train.init="
                "champion): the cost charged is this run's continuation only, not the "
                "champion's own training.")
    return ("Training started from the configured base model through the cold start "
            "(train.init=base): the cost charged is the whole recipe.")


def _scripted_delta(evaluation: EvalResult) -> tuple[float, float, float] | None:
    delta = evaluation.deltas.get(SCRIPTED)
    if SCRIPTED not in evaluation.systems or delta is None:
        return None
    return (delta.mean, delta.lo, delta.hi)


def scripted_sentence(evaluation: EvalResult) -> tuple[str, bool]:
    """(for the decision box, whether it is a warning): how the trained policy compares with
    `scripted`, the strongest fixed program the project ships (it learns nothing). When the
    script matches or beats the policy, the policy did not learn what the world asks (the
    world's answer-novel and unseen-phrasing slices are built to need reading), and the
    report says so first; a policy ahead only within the interval is said to be
    indistinguishable from it."""
    script, trained = evaluation.systems.get(SCRIPTED), evaluation.systems.get(TRAINED)
    if script is None:
        return ("Scripted baseline (the strongest fixed program we ship, no learning) not "
                "evaluated: this report has no evidence that the world needs learning (add "
                "scripted to eval.baselines).", False)
    if trained is None:
        return "", False
    se, te = script.summary.em.mean, trained.summary.em.mean
    delta = evaluation.deltas.get(SCRIPTED, NAN_INTERVAL)
    shown = (f"EM {_num(se)} vs {TRAINED} {_num(te)}, paired {TRAINED} - {SCRIPTED} "
             f"{_signed(delta)} (n={delta.n})")
    if not (math.isfinite(se) and math.isfinite(te)):
        return f"Scripted baseline: {shown}: not comparable (EM not finite).", False
    if se >= te:
        verb = "beats" if se > te else "matches"
        return (f"WARNING: the scripted baseline (a fixed program, no learning) {verb} the "
                f"trained policy: {shown}. The policy did not learn to do better than a fixed "
                "program: no accuracy figure in this report is evidence for RL.", True)
    if not (math.isfinite(delta.lo) and delta.lo > 0.0):
        return (f"Scripted baseline (no learning): {shown}: the trained policy is NOT "
                "distinguishable from a fixed script on this eval set (interval includes "
                "0).", False)
    return (f"Scripted baseline (no learning): {shown}: the trained policy beats the fixed "
            "program: it learnt more than a fixed program does.", False)


def provenance_sentence(config: PipelineConfig) -> tuple[str, bool]:
    """(How the recipe was chosen, whether this report's world is sealed): a synthetic world
    is sealed when its seed is not among `data.synthetic.tuning_seeds`, the worlds whose dev
    splits the hyperparameters were tuned on. Anything else is a labelled caveat."""
    head = "How the recipe was chosen: "
    if config.data.source != "synthetic":
        return (head + f"CAVEAT: tuning provenance not recorded for data.source="
                f"{config.data.source} (which data the hyperparameters were chosen on is not "
                "known to the pipeline): not a sealed result.", False)
    world = config.data.synthetic
    tuned = ", ".join(str(t) for t in world.tuning_seeds)
    if not world.tuning_seeds:
        return (head + f"CAVEAT: tuning provenance not recorded (data.synthetic.tuning_seeds "
                f"is empty), so this world (seed {world.seed}) may have been read while "
                "tuning: not a sealed result.", False)
    if world.seed in world.tuning_seeds:
        return (head + f"CAVEAT: this world (seed {world.seed}) was used for tuning "
                f"(data.synthetic.tuning_seeds: {tuned}): not a sealed result.", False)
    return (head + f"hyperparameters chosen on the dev splits of worlds {tuned} "
            f"(data.synthetic.tuning_seeds); this report's world (seed {world.seed}) is "
            "sealed: no tuning read it.", True)


def display_order(names: Iterable[str]) -> list[str]:
    """`DISPLAY_ORDER` first, then any other system in the order given."""
    names = list(names)
    return ([n for n in DISPLAY_ORDER if n in names]
            + [n for n in names if n not in DISPLAY_ORDER])


def not_evaluated(config: PipelineConfig, evaluation: EvalResult) -> tuple[str, ...]:
    """Systems asked for (eval.baselines, eval.frontier, the trained policy) that the
    evaluation does not have, in display order (the notes say why)."""
    wanted = [*config.eval.baselines, TRAINED] + [FRONTIER] * (config.eval.frontier is not None)
    return tuple(n for n in display_order(dict.fromkeys(wanted))
                 if n not in evaluation.systems)


def _roles(evaluation: EvalResult, names: Iterable[str]) -> dict[str, str]:
    """What each system is, for the decision box (an unknown one: its evaluation spec's)."""
    known = evaluation.systems
    return {n: SYSTEM_ROLES.get(n, known[n].spec.description if n in known else "")
            for n in names}


def world_card(evaluation: EvalResult, slices: SliceReport | None
               ) -> tuple[tuple[str, int, str], ...]:
    """(slice, questions, what it tests) for each named slice of the eval questions: counts
    from the trained policy's per-slice breakdown (its per-question results for an older
    results.json), descriptions as the evaluation recorded them, else the world module's."""
    trained = evaluation.systems.get(TRAINED)
    counts = {k: v.n for k, v in trained.by_slice.items()} if trained is not None else {}
    if not counts and slices is not None:
        counts = {s.name: s.n for s in slices.slices if s.kind == "slice"}
    card = dict(evaluation.slice_card)
    card |= known_slice_card([n for n in counts if n not in card])
    return tuple((name, n, card.get(name, "not described (no slice card recorded)"))
                 for name, n in sorted(counts.items()))


def _num(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else "n/a"


def _signed(iv: Interval) -> str:
    if iv.n == 0 or not math.isfinite(iv.mean):
        return "n/a"
    return f"{iv.mean:+.3f} [{iv.lo:+.3f}, {iv.hi:+.3f}]"


def selection_sentence(selection: Mapping[str, Any]) -> str:
    """Which checkpoint of the run was evaluated (and is registered on GO), and the other."""
    if not selection or selection.get("last_step") is None:
        return ""  # a reference from before selection was recorded
    metric = selection.get("metric") or "dev metric"

    def at(step: Any, value: Any) -> str:
        finite = isinstance(value, int | float) and math.isfinite(value)
        shown = f"{value:.3f}" if finite else "not evaluated"
        return f"step {step} ({metric} {shown})"

    last = at(selection.get("last_step"), selection.get("last_value"))
    if selection.get("stopped_early"):
        last += (", where training stopped early (train.early_stop_patience dev evaluations "
                 "in a row without a new best)")
    if selection.get("selection") == "best" and selection.get("selected_step") == 0:
        return (f"Evaluated and registered on GO: the start policy, "
                f"{at(0, selection.get('selected_value'))}, because no step's dev evaluation "
                f"beat it; the last step was {last}.")
    if selection.get("selection") == "best":
        return (f"Evaluated and registered on GO: the best dev checkpoint by {metric}, "
                f"{at(selection.get('selected_step'), selection.get('selected_value'))}; "
                f"the last step was {last}.")
    return (f"Evaluated and registered on GO: the last step's policy, {last} "
            "(train.keep_best is off).")


@dataclass(frozen=True)
class TrainingVolume:
    """What the prototype's training did, from the trainer's metrics.jsonl: steps done, and
    policy tokens (rollout_tokens + update_tokens summed over steps; per rank, as logged)."""

    steps: int | None
    tokens_per_rank: float | None


def training_volume(path: str | Path | None) -> TrainingVolume:
    """Steps done (the highest `step`) and summed tokens; None for what the file lacks."""
    steps: int | None = None
    tokens: float | None = None
    for row in _metric_rows(path):
        step = row.get("step")
        if isinstance(step, int | float) and math.isfinite(step):
            steps = max(steps or 0, int(step))
        for key in ("rollout_tokens", "update_tokens"):
            value = row.get(key)
            if isinstance(value, int | float) and math.isfinite(value):
                tokens = (tokens or 0.0) + float(value)
    return TrainingVolume(steps, tokens)


# The share of training steps that must update the policy for the `training` condition.
MIN_UPDATED_SHARE = 0.5


@dataclass(frozen=True)
class TrainingSteps:
    """What the trainer's steps did, from its metrics.jsonl. A step is skipped (its row has
    `skipped` 1) when no group had reward variance (`groups_used` 0) or a value was not
    finite; every other step updated the policy. `updates_to_selected` counts the updates up
    to the evaluated policy's step (the best dev checkpoint's, else the last)."""

    source: str
    steps: int
    skipped_no_variance: int
    skipped_nonfinite: int
    updates_to_selected: int
    selected_step: int | None = None

    @property
    def skipped(self) -> int:
        return self.skipped_no_variance + self.skipped_nonfinite

    @property
    def changed_nothing(self) -> bool:
        return self.updates_to_selected == 0

    def _causes(self) -> str:
        return (f"{self.skipped_no_variance} without reward variance, "
                f"{self.skipped_nonfinite} with non-finite values")

    def check(self) -> Check:
        """The gate's `training` condition: the evaluated policy must differ from the
        cold-start policy it was trained from, and at least half of the steps must have
        updated the policy (`MIN_UPDATED_SHARE`): a run where most steps found no reward
        variance learnt from a few groups by chance, not from its recipe."""
        if self.steps == 0:
            return Check("training", False, f"no training step is recorded in {self.source}: "
                                            "whether training changed the policy is unknown")
        if self.changed_nothing and self.skipped == self.steps:
            return Check("training", False, f"training changed nothing: all {self.steps} steps "
                                            f"were skipped ({self._causes()}); the evaluated "
                                            "policy is the cold-start policy")
        if self.changed_nothing and self.selected_step == 0:
            return Check("training", False, "training changed nothing: no dev evaluation "
                                            "beat the start's, so the evaluated policy is the "
                                            "cold-start policy (step 0)")
        if self.changed_nothing:
            return Check("training", False, f"training changed nothing: the evaluated policy "
                                            f"(step {self.selected_step}) is the cold-start "
                                            "policy, every step up to it was skipped")
        updated = self.steps - self.skipped
        counts = (f"{updated} of {self.steps} steps updated the policy; {self.skipped} "
                  f"skipped ({self._causes()})")
        if updated < MIN_UPDATED_SHARE * self.steps:
            return Check("training", False, f"too few steps updated the policy: {counts}, "
                                            f"under {MIN_UPDATED_SHARE:.0%} of them")
        return Check("training", True, counts)

    def sentence(self) -> str:
        """For the decision box."""
        detail = self.check().detail
        if detail.startswith("training changed nothing: "):
            return "Training changed nothing: " + detail.removeprefix("training changed nothing: ")
        return f"Training: {detail}."

    def figures(self) -> dict[str, float]:
        return {"training_steps": float(self.steps), "skipped_steps": float(self.skipped),
                "skipped_no_variance": float(self.skipped_no_variance),
                "skipped_nonfinite": float(self.skipped_nonfinite),
                "training_updates_evaluated": float(self.updates_to_selected)}


def training_steps(path: str | Path | None, selected_step: int | None) -> TrainingSteps | None:
    """The steps of the trainer's metrics JSONL (None without a path; 0 steps when it has
    no step rows). `selected_step`: the evaluated policy's step (None: the last)."""
    if path is None or str(path) == "":
        return None
    by_step: dict[int, dict[str, Any]] = {}
    for row in _metric_rows(path):
        step = row.get("step")
        # step 0 is the start's dev evaluation (train.keep_best), not a training step
        if isinstance(step, int | float) and math.isfinite(step) and step >= 1:
            by_step[int(step)] = row  # a resumed run rewrites its history: the last row wins
    skipped = {s: row for s, row in by_step.items() if row.get("skipped") == 1}
    nonfinite = sum(1 for row in skipped.values() if _positive(row.get("groups_used")))
    upto = selected_step if selected_step is not None else max(by_step, default=0)
    updates = sum(1 for s in by_step if s <= upto and s not in skipped)
    return TrainingSteps(str(path), len(by_step), len(skipped) - nonfinite, nonfinite, updates,
                         selected_step)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


def stage_costs(curriculum: CurriculumRef | None, checkpoint: CheckpointRef,
                evaluation: EvalRef | None) -> tuple[list[StageCost], list[str]]:
    """Each counted stage's wall time and devices as its reference recorded them, and notes.

    A missing curriculum or evaluation record counts 0 (noted); unrecorded training time is
    None, so the payback condition fails closed rather than calling training free.
    """
    notes: list[str] = []
    if curriculum is None or curriculum.seconds <= 0:
        notes.append("curriculum stage (cold start + difficulty estimate): no recorded wall "
                     "time" + (" (its ref.json is missing or stale)" if curriculum is None
                               else "") + ", counted as 0")
        cur = StageCost("curriculum", 0.0, 1)
    else:
        cur = StageCost("curriculum", curriculum.seconds, curriculum.devices)
    if checkpoint.earlier_attempts_seconds > 0:
        notes.append(f"training was resumed after an interruption: its wall time includes "
                     f"{checkpoint.earlier_attempts_seconds:.0f} s of earlier attempts (up to "
                     f"the checkpoint resumed from; work after it was redone and is counted "
                     f"once)")
    if checkpoint.seconds > 0:
        train = StageCost("training", checkpoint.seconds, checkpoint.devices)
    elif checkpoint.training_seconds > 0:
        notes.append("training stage wall time not recorded: the trainer's GRPO + cold-start "
                     "seconds are used")
        train = StageCost("training", checkpoint.training_seconds, checkpoint.devices)
    else:
        # 0 s means "not measured" (the CheckpointRef default): never a free training run.
        notes.append("training time was not recorded: payback cannot be computed")
        train = StageCost("training", None, checkpoint.devices)
    if evaluation is None or evaluation.seconds <= 0:
        notes.append("evaluation stage: no recorded wall time, counted as 0")
        ev = StageCost("evaluation", 0.0, 1)
    else:
        ev = StageCost("evaluation", evaluation.seconds, evaluation.devices)
    return [cur, train, ev], notes


def device_unit(device: str) -> str:
    """The cost unit's honest name: a CPU rank is a device, not a GPU."""
    return "GPU-hours" if resolve_device(device) == "cuda" else "device-hours (cpu)"


def build_gate(config: PipelineConfig, evaluation: EvalResult, *, gold_pairs: int | None,
               stages: Sequence[StageCost],
               training_curve: Mapping[str, list[tuple[int, float]]],
               volume: TrainingVolume = TrainingVolume(None, None),
               cost_notes: Sequence[str] = (),
               training: TrainingSteps | None = None,
               champion_version: str | None = None,
               ) -> tuple[GateResult, ReportInputs]:
    """Assemble the gate inputs (config first, measurements where config leaves None).
    With `training`, a run whose evaluated policy no step updated is a NO-GO (`training`).
    `champion_version`: the registry's current champion (None: none registered)."""
    g = config.gate
    notes: list[str] = list(evaluation.notes)
    comparator = comparator_of(config, evaluation)
    baseline = comparator.name
    notes += comparator.notes
    delta = evaluation.deltas.get(baseline, Interval(math.nan, math.nan, math.nan, 0))
    trained = evaluation.systems.get(TRAINED)
    measured_tokens = trained.summary.tokens_per_query if trained is not None else math.nan
    unit = device_unit(config.run.device)
    hours, projection, basis = _charged_hours(config, stages, volume, unit)
    notes += cost_notes
    costs = _cost_inputs(config, comparator, hours, measured_tokens)
    thresholds = GateThresholds(min_gold_pairs=g.min_gold_pairs,
                                min_accuracy_margin=g.min_accuracy_margin,
                                max_payback_months=g.max_payback_months,
                                champion_margin=g.champion_margin)
    champion = champion_inputs(config, evaluation, champion_version)
    result = decide(GateInputs(gold_pairs=gold_pairs, accuracy_delta=delta.mean,
                               accuracy_delta_lo=delta.lo, accuracy_delta_hi=delta.hi,
                               comparison_baseline=baseline, costs=costs,
                               comparator=comparator.kind,
                               allow_stand_in=g.allow_stand_in_comparator,
                               comparator_problem=comparator.problem,
                               champion=champion,
                               scripted_delta=_scripted_delta(evaluation)), thresholds)
    slices = slice_report(config, evaluation, baseline)
    result = _with_checks(result, training.check() if training is not None else None,
                          slices.check() if g.slice_regression == "fail" else None)
    selection = evaluation.policy_selection
    if selection.get("selection") == "best" and config.eval.split == "dev":
        notes.append("The evaluated policy was selected on the dev split it is evaluated on: "
                     "its EM is optimistic (set eval.split=test).")
    notes.append(f"Latency is batch-amortised wall time on device={config.run.device} "
                 f"(eval.batch_size={config.eval.batch_size}).")
    order = display_order(evaluation.systems)
    missing = not_evaluated(config, evaluation)
    scripted, scripted_warning = scripted_sentence(evaluation)
    provenance, sealed = provenance_sentence(config)
    suspects = _read_jsonl(evaluation.suspects_path)
    main = config.eval.split
    report = ReportInputs(
        title=f"searchrl go/no-go: {config.run.name}", gate=result, thresholds=thresholds,
        costs=costs, gold_pairs=gold_pairs, comparison_baseline=baseline, trained_name=TRAINED,
        eval_set=f"{evaluation.eval_set} ({evaluation.n_questions} questions)",
        systems={n: evaluation.systems[n].summary for n in order},
        by_hops={n: evaluation.systems[n].by_hops for n in order},
        by_type={TRAINED: trained.by_type} if trained is not None else {},
        searched_split={n: evaluation.systems[n].by_searched for n in order
                        if evaluation.systems[n].spec.mode == "agentic"},
        deltas=dict(evaluation.deltas), training_curve=dict(training_curve), suspects=suspects,
        payback_horizon_months=g.payback_horizon_months, notes=tuple(notes),
        eval_columns=_eval_columns(evaluation, order, main), main_split=main,
        stage_costs=tuple(stages), projection=projection, device_unit=unit, cost_basis=basis,
        comparator=comparator.sentence, policy_selection=selection_sentence(selection),
        champion=champion_sentence(champion, g.champion_margin), start=start_sentence(config),
        training=training.sentence() if training is not None else "",
        frontier_tokens_source=comparator.tokens_source,
        by_confidence={n: evaluation.systems[n].by_confidence for n in order
                       if evaluation.systems[n].spec.mode == "agentic"
                       and evaluation.systems[n].by_confidence},
        confidence_cuts=evaluation.confidence_cuts,
        train_suspects=(_read_jsonl(evaluation.train_audit.path)
                        if evaluation.train_audit else []),
        train_audit_questions=(evaluation.train_audit.n_questions
                               if evaluation.train_audit else 0),
        slices=slices, system_roles=_roles(evaluation, (*order, *missing)),
        not_evaluated=missing, scripted=scripted,
        scripted_warning=scripted_warning, provenance=provenance, sealed=sealed,
        world_card=world_card(evaluation, slices))
    return result, report


def _with_checks(result: GateResult, *checks: Check | None) -> GateResult:
    """`result` with the conditions decided outside `decide` (None: not applied) appended."""
    added = tuple(c for c in checks if c is not None)
    return GateResult(go=result.go and all(c.passed for c in added),
                      checks=(*result.checks, *added), payback=result.payback)


def _question_results(evaluation: EvalResult, name: str) -> list[QuestionResult] | None:
    """A system's per-question results from its questions file (None: missing/unreadable)."""
    system = evaluation.systems.get(name)
    path = system.questions_path if system is not None else ""
    if not path or not Path(path).is_file():
        return None
    try:
        return read_question_results(path)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def slice_report(config: PipelineConfig, evaluation: EvalResult, comparator: str
                 ) -> SliceReport:
    """The trained policy per hop count, question type and named slice against the
    comparator and the champion (when evaluated), with the evaluation's bootstrap settings
    (eval.bootstrap_samples, eval.confidence_level, run.seed), so slice intervals match the
    aggregate ones; a win is claimed only on gate.slice_claim_min_questions questions."""
    g, e = config.gate, config.eval
    trained = _question_results(evaluation, TRAINED)
    if trained is None:
        return SliceReport(g.slice_regression, g.slice_min_questions, e.confidence_level, (),
                           note="not computed: the trained policy's per-question results "
                                "(questions_*.jsonl) are missing; re-run evaluate_policy",
                           missing=(TRAINED,),
                           claim_min_questions=g.slice_claim_min_questions)
    against: dict[str, list[QuestionResult]] = {}
    missing: list[str] = []
    for name in dict.fromkeys((comparator, CHAMPION)):
        if name == TRAINED or name not in evaluation.systems:
            continue  # not evaluated: the accuracy / champion condition says so
        results = _question_results(evaluation, name)
        if results is None:
            missing.append(name)
        else:
            against[name] = results
    note = (f"not compared with {', '.join(missing)}: per-question results missing"
            if missing else "")
    return compute_slices(trained, against, mode=g.slice_regression,
                          min_questions=g.slice_min_questions, samples=e.bootstrap_samples,
                          level=e.confidence_level, seed=config.run.seed, note=note,
                          missing=tuple(missing),
                          claim_min_questions=g.slice_claim_min_questions)


def _cost_inputs(config: PipelineConfig, comparator: Comparator, hours: float | None,
                 measured_tokens: float) -> CostInputs:
    """The payback model's inputs: configured prices, measured tokens where config has none."""
    g = config.gate
    return CostInputs(
        gpu_type=g.gpu_type, gpu_price_per_hour=g.gpu_price_per_hour, training_gpu_hours=hours,
        production_queries_per_month=g.production_queries_per_month,
        small_tokens_per_query=(g.small_model_tokens_per_query
                                if g.small_model_tokens_per_query is not None
                                else measured_tokens),
        small_price_per_1k_tokens=g.small_model_price_per_1k_tokens,
        frontier_tokens_per_query=comparator.tokens_per_query,
        frontier_price_per_1k_tokens=comparator.price_per_1k_tokens)


def _charged_hours(config: PipelineConfig, stages: Sequence[StageCost], volume: TrainingVolume,
                   unit: str) -> tuple[float | None, Projection | None, str]:
    """(device-hours the payback condition charges, the projection, a sentence saying which)."""
    g = config.gate
    training = next((s for s in stages if s.stage == "training"), None)
    measured = training.device_hours if training is not None else math.nan
    devices = training.devices if training is not None else 1
    tokens = volume.tokens_per_rank * devices if volume.tokens_per_rank is not None else None
    projection = project_training(measured, steps_done=volume.steps, tokens_done=tokens,
                                  full_run_steps=g.full_run_steps,
                                  full_run_tokens=g.full_run_tokens)
    if g.training_gpu_hours is not None:
        return (g.training_gpu_hours, projection,
                f"Payback charges the configured gate.training_gpu_hours = "
                f"{g.training_gpu_hours:g} (measurements below are context).")
    total = total_device_hours(stages, projection)
    stage_names = " + ".join(s.stage for s in stages)
    if projection is None:
        basis = (f"Payback charges this run's measured {unit} ({stage_names}); no full-run "
                 "size is configured (gate.full_run_steps / gate.full_run_tokens), so nothing "
                 "is projected.")
    else:
        basis = (f"Payback charges the projected full run: training x{projection.ratio:.2f} by "
                 f"{projection.basis} ({projection.full:,.0f} configured / "
                 f"{_count(projection.done)} done), the other stages as measured.")
    return (total if math.isfinite(total) else None), projection, basis


def _count(x: float | None) -> str:
    return f"{x:,.0f}" if x is not None and math.isfinite(x) else "n/a"


def _eval_columns(evaluation: EvalResult, order: Sequence[str], main: str
                  ) -> dict[str, dict[str, Summary]]:
    """Eval set -> system -> summary: the main split first, then each extra set."""
    columns = {main: {n: evaluation.systems[n].summary for n in order}}
    for name, one in evaluation.extra_sets.items():
        columns[name if name != main else f"{name} (extra)"] = {
            n: one.systems[n] for n in order if n in one.systems}
    return columns


def _read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    if not Path(path).is_file():
        return []
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def decision_figures(result: GateResult, report: ReportInputs) -> dict[str, float]:
    """The headline numbers (NaN where unavailable), for MLflow metrics and the Decision."""
    trained = report.systems.get(report.trained_name)
    base = report.systems.get(report.comparison_baseline)
    delta = report.deltas.get(report.comparison_baseline)
    p = result.payback
    nan = math.nan
    return {
        "go": float(result.go),
        "em_trained": trained.em.mean if trained else nan,
        "em_baseline": base.em.mean if base else nan,
        "em_delta": delta.mean if delta else nan,
        "em_delta_lo": delta.lo if delta else nan,
        "em_delta_hi": delta.hi if delta else nan,
        "gold_pairs": float(report.gold_pairs) if report.gold_pairs is not None else nan,
        "tokens_per_query": (report.costs.small_tokens_per_query
                             if report.costs.small_tokens_per_query is not None else nan),
        "training_cost": p.training_cost if p else nan,
        "monthly_saving": p.monthly_saving if p else nan,
        "payback_months": p.payback_months if p else nan,
        "suspect_labels": float(len(report.suspects)),
        "suspect_gold_likely_wrong": float(sum(1 for s in report.suspects
                                               if s.get("tier") == GOLD_LIKELY_WRONG)),
        "device_hours_charged": (report.costs.training_gpu_hours
                                 if report.costs.training_gpu_hours is not None else nan),
        "projection_ratio": report.projection.ratio if report.projection else nan,
        "comparator_is_frontier": float(report.comparison_baseline == FRONTIER),
        "scripted_matches_or_beats_trained": float(report.scripted_warning),
        "sealed_world": float(report.sealed),
    } | {f"{s.stage}_device_hours": s.device_hours for s in report.stage_costs} | (
        report.slices.figures() if report.slices is not None else {})


def write_gate_report(config: PipelineConfig, evaluation: EvalResult, out_dir: Path, *,
                      gold_pairs: int | None, stages: Sequence[StageCost],
                      metrics_path: str | Path | None,
                      cost_notes: Sequence[str] = (),
                      champion_version: str | None = None) -> GateOutcome:
    """Decide, render, write. decision.json is removed first and written last."""
    out_dir.mkdir(parents=True, exist_ok=True)
    decision_path = out_dir / "decision.json"
    decision_path.unlink(missing_ok=True)
    curve = load_training_curve(metrics_path, config.gate.training_curve_metrics)
    selected = evaluation.policy_selection.get("selected_step")
    training = training_steps(metrics_path, selected if isinstance(selected, int) else None)
    result, report = build_gate(config, evaluation, gold_pairs=gold_pairs, stages=stages,
                                training_curve=curve, volume=training_volume(metrics_path),
                                cost_notes=cost_notes, training=training,
                                champion_version=champion_version)
    html_path, md_path = out_dir / "report.html", out_dir / "report.md"
    atomic_write_text(html_path, render_html(report))
    atomic_write_text(md_path, render_markdown(report))
    figures = decision_figures(result, report) | (training.figures() if training else {})
    comparator = comparator_of(config, evaluation)
    atomic_write_text(decision_path, json.dumps(
        {**result.to_dict(), "reasons": list(result.reasons),
         "comparison_baseline": report.comparison_baseline, "figures": figures,
         "comparator": {"name": comparator.name, "kind": comparator.kind,
                        "problem": comparator.problem, "text": comparator.sentence,
                        "stand_in_allowed": config.gate.allow_stand_in_comparator},
         "policy_selection": evaluation.policy_selection,
         "champion": {"version": champion_version, "margin": config.gate.champion_margin,
                      "text": report.champion},
         "train_init": config.train.init,
         "systems": {n: {"role": report.system_roles.get(n, ""), "n": s.n,
                         "em": s.em.to_dict(), "searches_per_question": s.searches_per_question,
                         "format_rate": s.format_rate}
                     for n, s in report.systems.items()},
         "not_evaluated": list(report.not_evaluated),
         "scripted": {"text": report.scripted, "warning": report.scripted_warning},
         "provenance": {"text": report.provenance, "sealed": report.sealed,
                        "tuning_seeds": list(config.data.synthetic.tuning_seeds)
                        if config.data.source == "synthetic" else None},
         "world_card": [{"slice": name, "n": n, "tests": text}
                        for name, n, text in report.world_card],
         "slices": report.slices.to_dict() if report.slices is not None else None,
         "cost_basis": report.cost_basis, "device_unit": report.device_unit,
         "stages": [{"stage": c.stage, "seconds": c.seconds, "devices": c.devices}
                    for c in report.stage_costs],
         "notes": list(report.notes)}, indent=2))
    return GateOutcome(result=result, report=report, html_path=html_path, md_path=md_path,
                       decision_path=decision_path, figures=figures)

