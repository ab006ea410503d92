"""The rollout's tag protocol as text: the tags, what in untrusted text could pass for one,
and how to defuse it.

Its own module because both sides need it: `rl` builds prompts and scores completions with
these tags, and `retrieval` neutralises passages and flags tag-like queries; neither package
may import the other's modules for it (the package import graph stays acyclic,
tests/unit/test_architecture.py).
"""

from __future__ import annotations

import re

# The protocol's tags (Search-R1): <think>, <search>, <information>, <answer>.
TAGS = ("think", "search", "information", "answer")

# Anything in untrusted text that a tokenizer or a parser of the rollout could take for a tag:
# the protocol's tags and the tool-use tags of common chat templates, tolerant of case, inner
# spaces, attributes and a missing `>` (`< /Answer >`, `<ANSWER id=1>`, `<answer`), and
# chat-template markers (`<|im_end|>`).
TAG_LIKE = re.compile(
    r"<\s*/?\s*(?:" + "|".join((*TAGS, "result", "tool_call", "tool_response"))
    + r")\b(?:[^<>]*>)?|<\|[^<>|]{0,40}\|>",
    re.IGNORECASE,
)


def neutralize_tags(text: str) -> str:
    """`text` with every `TAG_LIKE` match escaped (`<answer>` -> `&lt;answer&gt;`), other text
    (`a < b`, `<b>bold</b>`) as is. Idempotent: an escaped tag contains no `<`.

    A passage carrying `</information><answer>X</answer>` could otherwise end the information
    block and forge an answer.
    """
    return TAG_LIKE.sub(lambda m: m.group(0).replace("<", "&lt;").replace(">", "&gt;"), text)
