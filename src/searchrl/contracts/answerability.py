"""Where do gold answers occur in the corpus: one Aho-Corasick pass over the normalised corpus.

A Python loop of substring searches (every answer against every passage) is O(answers x
corpus); the automaton matches all normalised answers at once, so the cost is one scan of the
corpus plus one step per match, whatever the number of answers. Matches are whole-token
(answers and passages are padded with spaces), so "1919" is not found in "19190".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import ahocorasick

from searchrl.text import normalize_answer
from searchrl.types import Passage


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


def find_answers(answers: Iterable[str],
                 corpora: Iterable[tuple[str, Iterable[Passage]]]) -> dict[str, AnswerHit]:
    """Map each *normalised* answer found anywhere in the corpora to its first hit.

    `answers` must already be normalised (see `normalize_answer`); blank answers are ignored.
    `corpora` is (corpus name, passages) pairs, scanned in order. Answers absent from the
    result occur in no passage.
    """
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
