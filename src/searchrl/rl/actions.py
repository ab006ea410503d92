"""The tag protocol's action parser.

A rollout turn is generated until `</search>`, `</answer>` or EOS. `parse_action` turns the
text the policy generated in that turn into one action: `Search(query)`, `Answer(text)` or
`Invalid(reason)`. It is only ever given policy text (plus the trusted `<answer>` opener the
template may insert), never the prompt or inserted `<information>`; that is what keeps an
`<answer>` inside a passage from scoring (and `searchrl.tags.neutralize_tags` defuses tags in
that text besides).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Search:
    query: str


@dataclass(frozen=True)
class Answer:
    text: str


@dataclass(frozen=True)
class Invalid:
    reason: str


Action = Search | Answer | Invalid


def parse_action(turn_text: str) -> Action:
    """The action one generated turn ends with.

    The first closing `</search>` or `</answer>` decides (generation stops there; text after it
    in the same token is ignored). Its content is the text after the last matching opener
    before it. A closing tag without an opener, an empty query, or no closing tag at all is
    `Invalid`. An empty answer is `Answer("")` (it simply scores 0).
    """
    ends = [(turn_text.find(f"</{name}>"), name) for name in ("search", "answer")]
    found = [(pos, name) for pos, name in ends if pos >= 0]
    if not found:
        return Invalid("no closing </search> or </answer>")
    close_pos, name = min(found)
    open_tag = f"<{name}>"
    open_pos = turn_text.rfind(open_tag, 0, close_pos)
    if open_pos < 0:
        return Invalid(f"</{name}> without <{name}>")
    content = turn_text[open_pos + len(open_tag):close_pos].strip()
    if name == "answer":
        return Answer(content)
    if not content:
        return Invalid("empty search query")
    return Search(content)


def extract_answer(completion_text: str) -> str | None:
    """The content of the last complete `<answer>...</answer>` block (stripped), or None."""
    blocks = _ANSWER_BLOCK.findall(completion_text)
    return blocks[-1].strip() if blocks else None
