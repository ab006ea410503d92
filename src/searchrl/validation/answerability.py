"""Where do gold answers occur in the corpus: one Aho-Corasick pass over the normalised corpus.

A Python loop of substring searches (every answer against every passage) is O(answers x
corpus); the automaton matches all normalised answers at once, so the cost is one scan of the
corpus plus one step per match, whatever the number of answers. Matches are whole-token
(answers and passages are padded with spaces), so "1919" is not found in "19190".

Normalising every passage is most of that scan's cost (~50 us a passage: minutes at wiki
scale), so `AnswerScan` normalises only passages that can hold an answer not found yet: each
token of a normalised passage is a substring of the passage lower-cased with its ASCII
punctuation deleted (removing articles and spaces only cuts it into pieces), so a passage
whose such "skeleton" contains no answer's longest token holds no answer. Skeletons of a
chunk of passages are made in a few C calls, and an answer drops out of the filter once
found (only its first hit is kept), so after the first chunks most passages are skipped
unread. The hits are exactly those of normalising every passage (tests check this).
"""

from __future__ import annotations

import re
import string
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import ahocorasick

from searchrl.text import normalize_answer
from searchrl.types import Passage

_PUNCT_BYTES = string.punctuation.encode()  # what normalize_answer deletes (ASCII only)
_SEP = "\x00"
_SEP_RE = re.compile(_SEP)
_FEW_ANCHORS = 16  # up to this many, `in` per anchor; more, the anchor automaton
_STEP = 2_000  # passages filtered at once


@dataclass(frozen=True)
class AnswerHit:
    """First passage in corpus order whose normalised text contains the normalised answer."""

    passage_id: str
    corpus: str


def passage_text(passage: Passage) -> str:
    """The text a reader sees for a passage: title (when not already leading) + contents."""
    if passage.title and not passage.contents.startswith(passage.title) and \
            not passage.contents.startswith(f'"{passage.title}"'):
        return f"{passage.title}\n{passage.contents}"
    return passage.contents


def _skeleton(text: str) -> str:
    """`text` lower-cased, ASCII punctuation deleted: as normalize_answer before articles and
    spaces (bytes.translate: ASCII bytes never occur inside a multi-byte UTF-8 character)."""
    raw = text.lower().encode("utf-8", "surrogatepass")
    return raw.translate(None, _PUNCT_BYTES).decode("utf-8", "surrogatepass")


class AnswerScan:
    """The first hit of each normalised answer, fed passages chunk by chunk in corpus order.

    `hits`: answer -> its first hit; `passages`: the passage of every hit, by id.
    """

    def __init__(self, answers: Iterable[str]) -> None:
        self.remaining = {a for a in answers if a}
        self.hits: dict[str, AnswerHit] = {}
        self.passages: dict[str, Passage] = {}
        self._build()

    def _build(self) -> None:
        self._full = ahocorasick.Automaton()
        self._anchors = ahocorasick.Automaton()
        self._anchor_set = {max(answer.split(), key=len) for answer in self.remaining}
        for answer in self.remaining:
            self._full.add_word(f" {answer} ", answer)
        for anchor in self._anchor_set:
            self._anchors.add_word(anchor, anchor)
        if self.remaining:
            self._full.make_automaton()
            self._anchors.make_automaton()

    def feed(self, corpus: str, passages: Sequence[Passage]) -> None:
        """The next passages of `corpus` (in order)."""
        # Small steps: an answer found drops out of the filter for the passages after it.
        for start in range(0, len(passages), _STEP):
            if not self.remaining:
                return
            self._feed(corpus, passages[start:start + _STEP])

    def _feed(self, corpus: str, passages: Sequence[Passage]) -> None:
        texts = [passage_text(p) for p in passages]
        found = False
        for i in self._candidates(texts):
            text = f" {normalize_answer(texts[i])} "
            for _, answer in self._full.iter(text):
                if answer in self.remaining:
                    self.hits[answer] = AnswerHit(passages[i].id, corpus)
                    self.passages.setdefault(passages[i].id, passages[i])
                    self.remaining.discard(answer)
                    found = True
        if found:
            self._build()

    def _candidates(self, texts: list[str]) -> list[int]:
        """Indices of the texts whose skeleton holds a remaining answer's longest token."""
        joined = _SEP.join(texts)
        if joined.count(_SEP) != len(texts) - 1:  # a text holds the separator itself
            return list(range(len(texts)))
        skeleton = _skeleton(joined)
        if len(self._anchor_set) <= _FEW_ANCHORS and \
                not any(anchor in skeleton for anchor in self._anchor_set):
            return []  # a few substring searches beat one automaton pass
        ends = [end for end, _ in self._anchors.iter(skeleton)]
        if not ends:  # the usual case once the common answers are found
            return []
        bounds = [m.start() for m in _SEP_RE.finditer(skeleton)]
        return sorted({bisect_left(bounds, end) for end in ends})


def find_answers(answers: Iterable[str],
                 corpora: Iterable[tuple[str, Iterable[Passage]]],
                 chunk: int = 10_000) -> dict[str, AnswerHit]:
    """Map each *normalised* answer found anywhere in the corpora to its first hit.

    `answers` must already be normalised (see `normalize_answer`); blank answers are ignored.
    `corpora` is (corpus name, passages) pairs, scanned in order. Answers absent from the
    result occur in no passage.
    """
    scan = AnswerScan(answers)
    for corpus_name, passages in corpora:
        batch: list[Passage] = []
        for passage in passages:
            batch.append(passage)
            if len(batch) >= chunk:
                scan.feed(corpus_name, batch)
                batch = []
        scan.feed(corpus_name, batch)
    return scan.hits


def find_answers_exhaustive(answers: Iterable[str],
                            corpora: Iterable[tuple[str, Iterable[Passage]]]
                            ) -> dict[str, AnswerHit]:
    """`find_answers` by normalising every passage (the reference the filter must equal)."""
    automaton = ahocorasick.Automaton()
    for answer in set(answers):
        if answer:
            automaton.add_word(f" {answer} ", answer)
    found: dict[str, AnswerHit] = {}
    if len(automaton) == 0:
        return found
    automaton.make_automaton()
    for corpus_name, passages in corpora:
        for passage in passages:
            text = f" {normalize_answer(passage_text(passage))} "
            for _, answer in automaton.iter(text):
                if answer not in found:
                    found[answer] = AnswerHit(passage.id, corpus_name)
    return found


def snippet(text: str, needle: str, width: int = 240) -> str:
    """A window of `text` around the first case-insensitive occurrence of `needle`'s first
    word (the raw text is not normalised, so the exact answer may not occur verbatim);
    the head of the text when it does not occur."""
    words = needle.split()
    pos = text.lower().find(words[0].lower()) if words else -1
    if pos < 0:
        return text[:width] + ("..." if len(text) > width else "")
    start = max(0, pos - width // 2)
    end = min(len(text), start + width)
    return ("..." if start else "") + text[start:end] + ("..." if end < len(text) else "")
