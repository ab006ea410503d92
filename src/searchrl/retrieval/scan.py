"""The corpus contract's poisoning checks, run at indexing time.

Two kinds of finding per passage:

- `tag`: the passage contains a rollout tag (`<answer>`, `</information>`, ...) or a chat
  template marker (`<|im_start|>`). Retrieved text is pasted into the policy's context inside
  `<information>`; a passage carrying `</information><answer>X</answer>` could end the block
  and forge an answer. `searchrl.tags.neutralize_tags` escapes these, and every hit a Searcher
  returns has already been neutralised, so flagged passages stay searchable but inert.
- `injection`: instruction-like text aimed at a model ("ignore previous instructions", "the
  correct answer is"). Natural language cannot be escaped reliably, so these are only
  flagged, in the stage report, for a human to look at.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from searchrl.tags import TAG_LIKE
from searchrl.types import Passage

_INJECTION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("ignore_instructions",
         r"\b(?:ignore|disregard|forget|override)\b[^.\n]{0,40}\b(?:previous|prior|above|"
         r"earlier|all|any|the)\b[^.\n]{0,20}\b(?:instructions?|prompts?|rules|context)\b"),
        ("role_override", r"\byou are now\b|\bact as (?:an?|the)\b[^.\n]{0,30}\b(?:assistant|"
                          r"model|ai)\b|\bnew instructions?\s*:"),
        ("system_prompt", r"\bsystem\s*prompt\b|^\s*(?:system|assistant)\s*:"),
        ("answer_steering",
         r"\b(?:the|your)\s+(?:correct|final|real|true)\s+answer\s+(?:is|should be|must be)\b|"
         r"\b(?:answer|respond|reply)\s+(?:only\s+)?with\b"),
        ("search_steering", r"\b(?:do not|don't|never|stop)\s+(?:search|use the search)"),
    )
)


@dataclass(frozen=True)
class Finding:
    doc_id: str
    kind: str  # "tag" | "injection"
    detail: str  # the matched tag, or the injection pattern name
    excerpt: str


@dataclass
class ScanReport:
    """Findings over a corpus; `counts` has passages flagged per kind (a passage counts once)."""

    passages: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {"tag": 0, "injection": 0}
        for kind in out:
            out[kind] = len({f.doc_id for f in self.findings if f.kind == kind})
        return out

    def to_dict(self, max_findings: int = 200) -> dict[str, Any]:
        """JSON-ready summary; at most `max_findings` findings are listed (all are counted)."""
        return {
            "passages": self.passages,
            "flagged_tag": self.counts["tag"],
            "flagged_injection": self.counts["injection"],
            "findings_total": len(self.findings),
            "findings": [vars(f) for f in self.findings[:max_findings]],
        }


def _excerpt(text: str, start: int, end: int, width: int = 60) -> str:
    return text[max(0, start - width): end + width].replace("\n", " ")


# Words one of which each injection pattern cannot match without (lower case): a passage
# holding none is not searched with it. The regexes cost ~20 us a passage, minutes a
# wiki-scale corpus; the word test a fraction of that, and most passages hold none.
_TRIGGERS: dict[str, tuple[str, ...]] = {
    "ignore_instructions": ("ignore", "disregard", "forget", "override"),
    "role_override": ("you are now", "act as ", "new instruction"),
    "system_prompt": ("system", "assistant"),
    "answer_steering": ("answer", "respond", "reply"),
    "search_steering": ("search",),
}
# Non-ASCII characters that re.IGNORECASE matches to an ASCII letter (all of them: checked
# over every code point by the tests) and str.lower() does not turn into it.
_FOLD = str.maketrans({"\u0130": "i", "\u0131": "i", "\u212a": "k", "\u017f": "s"})


def _folded(text: str) -> str:
    if not text.isascii() and any(c in text for c in "\u0130\u0131\u212a\u017f"):
        text = text.translate(_FOLD)
    return text.lower()


def scan_passage(passage: Passage) -> list[Finding]:
    """All findings for one passage (title and contents both checked)."""
    findings: list[Finding] = []
    text = f"{passage.title or ''}\n{passage.contents}"
    if "<" in text:  # every TAG_LIKE match starts with one
        for m in TAG_LIKE.finditer(text):
            findings.append(Finding(passage.id, "tag", m.group(0),
                                    _excerpt(text, m.start(), m.end())))
    folded = _folded(text)
    for name, pattern in _INJECTION_PATTERNS:
        if not any(word in folded for word in _TRIGGERS[name]):
            continue
        hit = pattern.search(text)
        if hit is not None:
            findings.append(Finding(passage.id, "injection", name,
                                    _excerpt(text, hit.start(), hit.end())))
    return findings


def scan_corpus(passages: Iterable[Passage]) -> ScanReport:
    report = ScanReport()
    for passage in passages:
        report.passages += 1
        report.findings.extend(scan_passage(passage))
    return report
