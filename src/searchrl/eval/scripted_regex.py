"""The issue-33 scripted program, kept unchanged (class renamed `RegexScriptedSystem`) only so
that benchmarks/bench_scripted.py can print it beside its successor; the pipeline's `scripted`
system is `searchrl.eval.scripted.ScriptedSystem`. Not imported by any stage.

What it was: the best fixed program written against the train split's phrasings, with
retriever calls and regular expressions and no learning.

1. Question templates come from the **train** split only: each train question with its
   entity replaced by a slot (the longest capitalised name, or the two names of a
   comparison) is a template of its question type. A held-out question that matches a
   template gets that type; one that matches none gets the type of the train template
   sharing the most words with it.
2. Each type is a fixed plan of searches read with regular expressions over the corpus's
   sentence forms.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from searchrl.eval.scripted import FixedReader, Mention
from searchrl.retrieval.base import Searcher
from searchrl.types import QAExample

_WORD = re.compile(r"[a-z]+")
# A capitalised name in a question, optionally "the <profession>" before it.
_MENTION = re.compile(r"(?:\bthe ([a-z]+) )?((?:[A-Z][a-z]+)(?: [A-Z][a-z]+)*)")
_SLOT = "\x00"
_QUESTION_WORDS = {"in", "where", "what", "which", "who", "whose", "when", "name", "give",
                   "of", "from", "the"}


def _mentions(question: str) -> list[Mention]:
    """(profession or None, name) of each capitalised name; the question's first word is
    dropped from a name when it is a question word capitalised as a sentence start."""
    found: list[Mention] = []
    for m in _MENTION.finditer(question):
        name = m.group(2)
        if m.start(2) == 0:
            first, _, rest = name.partition(" ")
            if first.lower() in _QUESTION_WORDS:
                if not rest:
                    continue
                name = rest
        found.append((m.group(1), name))
    return found


def _template(question: str, mentions: Sequence[Mention]) -> str:
    text = question
    for prof, name in mentions:
        spelled = f"the {prof} {name}" if prof else name
        text = text.replace(spelled, _SLOT, 1)
    return text.lower()


class RegexScriptedSystem(FixedReader):
    """Understands questions by their train templates (regular expressions over literal
    phrasings); reads them as `FixedReader` does."""

    def __init__(self, train: Sequence[QAExample], searcher: Searcher, top_k: int = 3):
        self.searcher = searcher
        self.top_k = top_k
        votes: dict[str, Counter[str]] = {}
        for ex in train:
            if ex.type is None:
                continue
            votes.setdefault(_template(ex.question, _mentions(ex.question)), Counter())[
                ex.type] += 1
        self.templates = {t: c.most_common(1)[0][0] for t, c in votes.items()}
        self.template_words = {t: set(_WORD.findall(t)) for t in self.templates}

    def understand(self, question: str) -> tuple[str | None, list[Mention]]:
        mentions = _mentions(question)
        template = _template(question, mentions)
        if template in self.templates:
            return self.templates[template], mentions
        words = set(_WORD.findall(template))
        best = max(self.templates, default=None,
                   key=lambda t: (len(words & self.template_words[t])
                                  / (len(words | self.template_words[t]) or 1), t))
        return (self.templates[best] if best is not None else None), mentions
