"""The tag protocol's action parser and the tag neutraliser for untrusted text.

A rollout turn is generated until `</search>`, `</answer>` or EOS. `parse_action` turns the
text the policy generated in that turn into one action: `Search(query)`, `Answer(text)` or
`Invalid(reason)`. It is only ever given policy text (plus the trusted `<answer>` opener the
template may insert), never the prompt or inserted `<information>`; that is what keeps an
`<answer>` inside a passage from scoring.

`neutralize_tags` makes text from outside the policy (passages, questions) unable to form a
protocol tag, whatever the tokenizer: the `<` of anything tag-shaped becomes `&lt;`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TAG_NAMES = ("think", "search", "information", "answer")

# Anything tag-shaped for a protocol tag name, tolerant of case and inner spaces, so a
# passage cannot smuggle `< /Answer >` past a case-sensitive check.
_TAG_LIKE = re.compile(r"<(?=\s*/?\s*(?:think|search|information|answer)\b)", re.IGNORECASE)
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


def neutralize_tags(text: str) -> str:
    """`text` with every protocol-tag-shaped `<...>` defused (`<` -> `&lt;`); other text kept."""
    return _TAG_LIKE.sub("&lt;", text)


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
