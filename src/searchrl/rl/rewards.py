"""Rewards: pure, deterministic functions of the policy's completion text only.

The completion is what the policy sampled (plus the trusted `<answer>` opener the template may
insert); never the prompt, never inserted `<information>` text. So an answer planted in a
passage cannot score: it is not in the text these functions see.

Shaped reward (Search-R1 with format reward, generalised to a graded answer score `a` in
[0, 1], `a` = EM or token F1 per `reward.kind`). Each completion is scored under exactly one
case, recorded in its parts (`forced`, `malformed`) so metrics can count them:

    well-formed:      format_weight + (1 - format_weight) * a   (a=1 -> 1, a=0 -> format_weight)
    forced answer:    forced_answer_scale * a     (the template opened `<answer>`, after
                                                   max_turns or in a baseline mode; the rest is
                                                   well-formed; no format credit)
    malformed, by `reward.malformed`:
        scale:        correct_bad_format * a      (a=1 -> lambda, a=0 -> 0)
        forfeit:      0                           (Search-R1: the answer reward is forfeited)
        penalty:      malformed_penalty           (in [-1, 0], whatever the answer)
    total = that - search_cost * n_searches                 (search_cost_applies_to: all)
    total = that - c * search_cost * n_searches             (search_cost_applies_to: correct)

where `c` is the answer score the case credits: `a`, except 0 for forfeit / penalty, so a
forfeited right answer never pays more for its searches than a wrong one.

`is_correct` (binary normalised EM of the extracted answer) is kept separate: curriculum
filtering and evaluation use it, never the shaped reward.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from searchrl.config import RewardConfig
from searchrl.rl.actions import extract_answer
from searchrl.tags import TAGS
from searchrl.text import normalize_answer

_TAG = re.compile(r"</?(" + "|".join(TAGS) + r")>")


def exact_match(prediction: str, golden_answers: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0.

    A prediction that normalises to nothing never matches (a gold like "The" would otherwise
    reward an empty answer).
    """
    pred = normalize_answer(prediction)
    return float(bool(pred) and any(pred == normalize_answer(g) for g in golden_answers))


def _f1_one(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not gold_tokens:
        return 0.0
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golden_answers: Sequence[str]) -> float:
    """Max token F1 over gold answers (normalised, whitespace tokens); an empty prediction is 0."""
    pred = normalize_answer(prediction).split()
    if not pred:
        return 0.0
    return max((_f1_one(pred, normalize_answer(g).split()) for g in golden_answers),
               default=0.0)


def format_score(completion_text: str) -> float:
    """1.0 iff the completion is a well-formed tag sequence, else 0.0.

    Well-formed: only whitespace outside blocks; blocks are `<think>`, `<search>` or
    `<answer>` (the policy never writes `<information>`), never nested; at most one `<think>`
    before each `<search>`/`<answer>`; every search non-empty; exactly one answer, the last
    block.
    """
    pos = 0
    blocks: list[tuple[str, str]] = []
    parts = list(_TAG.finditer(completion_text))
    i = 0
    while i < len(parts):
        opening = parts[i]
        if completion_text[pos:opening.start()].strip():
            return 0.0
        name = opening.group(1)
        if opening.group(0).startswith("</") or name == "information":
            return 0.0
        if i + 1 >= len(parts) or parts[i + 1].group(0) != f"</{name}>":
            return 0.0
        closing = parts[i + 1]
        blocks.append((name, completion_text[opening.end():closing.start()]))
        pos = closing.end()
        i += 2
    if completion_text[pos:].strip() or not blocks:
        return 0.0
    names = [name for name, _ in blocks]
    if names[-1] != "answer" or names.count("answer") != 1:
        return 0.0
    previous = ""
    for name, content in blocks:
        if name == "think" and previous == "think":
            return 0.0
        if name == "search" and not content.strip():
            return 0.0
        previous = name
    return 1.0


@dataclass(frozen=True)
class RewardParts:
    """The reward and its parts (all floats so they log and average directly)."""

    total: float
    em: float
    f1: float
    format: float
    answered: float
    search_penalty: float
    forced: float = 0.0  # 1.0: the template opened the answer (max_turns or baseline mode)
    malformed: float = 0.0  # 1.0: scored under `reward.malformed` (the format check failed)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def score(completion_text: str, golden_answers: Sequence[str], n_searches: int,
          reward_cfg: RewardConfig, *, forced_answer: bool = False) -> RewardParts:
    """The shaped reward of one completion (see the module docstring for the formula).

    `forced_answer`: the template opened the answer (after `max_turns`, or a baseline mode),
    so the decision to answer is not the policy's own: it earns no format credit and is
    scored as the forced case, unless the policy's part is malformed.
    """
    answer = extract_answer(completion_text)
    em = exact_match(answer, golden_answers) if answer is not None else 0.0
    f1_value = f1(answer, golden_answers) if answer is not None else 0.0
    # The forced opener is part of the scored text, so the tag check still sees a whole
    # `<answer>` block and judges what the policy wrote around it.
    well_formed = format_score(completion_text) == 1.0
    graded = em if reward_cfg.kind == "em" else f1_value
    credited = graded
    if not well_formed:
        if reward_cfg.malformed == "scale":
            shaped = reward_cfg.correct_bad_format * graded
        else:
            shaped = 0.0 if reward_cfg.malformed == "forfeit" else reward_cfg.malformed_penalty
            credited = 0.0
    elif forced_answer:
        shaped = reward_cfg.forced_answer_scale * graded
    else:
        shaped = reward_cfg.format_weight + (1.0 - reward_cfg.format_weight) * graded
    penalty = reward_cfg.search_cost * n_searches
    if reward_cfg.search_cost_applies_to == "correct":
        penalty *= credited
    return RewardParts(total=shaped - penalty, em=em, f1=f1_value,
                       format=float(well_formed and not forced_answer),
                       answered=float(answer is not None), search_penalty=penalty,
                       forced=float(forced_answer), malformed=float(not well_formed))


def is_correct(completion_text: str, golden_answers: Sequence[str]) -> bool:
    """Binary correctness for curriculum/evaluation: normalised EM of the extracted answer."""
    answer = extract_answer(completion_text)
    return answer is not None and exact_match(answer, golden_answers) == 1.0
