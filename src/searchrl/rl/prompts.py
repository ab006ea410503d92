"""The prompt template and the template glue the rollout inserts between policy turns.

Protocol (Search-R1): the policy reasons in `<think>...</think>`, asks the search engine with
`<search>query</search>`, receives the top passages in `<information>...</information>`
(inserted by the rollout, never sampled) and ends with `<answer>...</answer>`.

Everything here is trusted template text. Text from outside (questions, passages, search
errors) goes through `searchrl.tags.neutralize_tags` before it is placed next to the tags.
"""

from __future__ import annotations

from collections.abc import Sequence

from searchrl.tags import neutralize_tags
from searchrl.types import SearchHit

PROMPT_TEMPLATE = (
    "Answer the question. Reason inside <think> and </think>. To look something up, write "
    "<search> query </search>; the results come back inside <information> and "
    "</information>. Give the final answer inside <answer> and </answer>.\n"
    "Question: {question}\n"
    # A constant cue after the question: the policy's text starts after the same tokens
    # whatever the question's wording. Without it a question phrased as a request ("Tell me
    # ... .") ended where no cold-start question did ("?"), and the prior kept writing the
    # question instead of opening <think> (docs/results/prior.md, "The prompt's last line").
    "Response:\n"
)

# Glue around an inserted information block (mask 0). The newlines keep the block visually
# apart from the policy's text; tokenised separately, so they never merge with policy tokens.
INFO_OPEN = "\n<information>"
INFO_CLOSE = "</information>\n"
# Opens the final answer when the template forces one (no_search / retrieve_once baselines,
# and after `max_turns` searches). The policy continues from it; it is scored as part of the
# completion because it is our own constant text, never retrieved text.
ANSWER_OPEN = "<answer>"

STOP_STRINGS = ("</search>", "</answer>")


def build_prompt(question: str) -> str:
    """The prompt for one question (tags in the question are neutralised)."""
    return PROMPT_TEMPLATE.format(question=neutralize_tags(question.strip()))


def format_passages(hits: Sequence[SearchHit]) -> str:
    """The body of an `<information>` block: numbered passages, tags neutralised.

    The rollout truncates the tokenised body to its token budget; callers that insert it
    elsewhere must neutralise again if they concatenate other untrusted text.
    """
    lines = []
    for i, hit in enumerate(hits, start=1):
        title = f" (Title: {hit.title})" if hit.title else ""
        lines.append(f"Doc {i}{title} {hit.contents}")
    return neutralize_tags("\n".join(lines))


def format_search_error(message: str) -> str:
    """The observation the policy sees when a search failed (counted separately as a metric)."""
    return neutralize_tags(f"Search failed: {message}")
