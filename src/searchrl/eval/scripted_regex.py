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
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from searchrl.retrieval.base import Searcher
from searchrl.types import QAExample, SearchHit

_NAME = r"[A-Z][a-z]+(?: [A-Z][a-z]+)?"
_WORD = re.compile(r"[a-z]+")
# A capitalised name in a question, optionally "the <profession>" before it.
_MENTION = re.compile(r"(?:\bthe ([a-z]+) )?((?:[A-Z][a-z]+)(?: [A-Z][a-z]+)*)")
_SLOT = "\x00"
_FACTS: dict[str, re.Pattern[str]] = {
    "born_city": re.compile(rf"(?:was born in|hometown is|is a native of) ({_NAME})"
                            rf"(?:, in ({_NAME}))?\."),
    "born_year": re.compile(r"(?:born in the year|year of birth is|came into the world in) "
                            r"(\d{4})"),
    "country": re.compile(rf"(?:is a city located in|lies in|is a town of the nation of) "
                          rf"({_NAME})"),
    "capital": re.compile(rf"(?:The capital of {_NAME} is ({_NAME})\.|is governed from "
                          rf"({_NAME})\.|({_NAME}) is the seat of government)"),
    "founder": re.compile(rf"(?:founded by|Its founder is) (?:the ([a-z]+) )?({_NAME})"
                          rf"(?: \(born (\d{{4}})\))?\.|(?:the ([a-z]+) )?({_NAME})"
                          rf"(?: \(born (\d{{4}})\))? established it"),
    "founded_year": re.compile(r"(?:It was founded in|It dates from|It was established in) "
                               r"(\d{4})"),
    "hq": re.compile(rf"(?:headquartered in|head office is in|is based in) ({_NAME})"),
}
# Classic world sentences: "<org> is a <industry> organisation founded by <person>."
_CLASSIC_FOUNDER = re.compile(rf"organisation founded by ({_NAME})\.")


@dataclass
class ScriptedAnswer:
    answer: str | None
    queries: list[str] = field(default_factory=list)
    retrieved_doc_ids: list[str] = field(default_factory=list)
    top_score: float | None = None
    qtype: str | None = None  # the type the script decided on
    latency_s: float = 0.0


def _mentions(question: str) -> list[tuple[str | None, str]]:
    """(profession or None, name) of each capitalised name; the question's first word is
    dropped from a name when it is a question word capitalised as a sentence start."""
    found: list[tuple[str | None, str]] = []
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


_QUESTION_WORDS = {"in", "where", "what", "which", "who", "whose", "when", "name", "give",
                   "of", "from", "the"}


def _template(question: str, mentions: Sequence[tuple[str | None, str]]) -> str:
    text = question
    for prof, name in mentions:
        spelled = f"the {prof} {name}" if prof else name
        text = text.replace(spelled, _SLOT, 1)
    return text.lower()


class RegexScriptedSystem:
    """Answers questions with fixed plans; templates read from `train` only."""

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

    def qtype(self, question: str) -> str | None:
        template = _template(question, _mentions(question))
        if template in self.templates:
            return self.templates[template]
        words = set(_WORD.findall(template))
        best = max(self.templates, default=None,
                   key=lambda t: (len(words & self.template_words[t])
                                  / (len(words | self.template_words[t]) or 1), t))
        return self.templates[best] if best is not None else None

    def answer(self, question: str) -> ScriptedAnswer:
        started = time.perf_counter()
        out = ScriptedAnswer(answer=None, qtype=self.qtype(question))
        mentions = _mentions(question)
        if out.qtype is not None and mentions:
            out.answer = self._plan(out.qtype, mentions, out)
        out.latency_s = time.perf_counter() - started
        return out

    # --- reading

    def _search(self, query: str, name: str, out: ScriptedAnswer) -> str:
        """The text of the best hit for `query`: the one titled `name` (or `name (...)`)
        among the top k, else the first."""
        out.queries.append(query)
        hits: list[SearchHit] = self.searcher.search_batch([query], self.top_k)[0]
        out.retrieved_doc_ids += [h.doc_id for h in hits]
        if out.top_score is None and hits:
            out.top_score = hits[0].score
        for h in hits:
            if h.title and (h.title == name or h.title.startswith(f"{name} (")):
                return h.contents
        return hits[0].contents if hits else ""

    def _person(self, prof: str | None, name: str, out: ScriptedAnswer) -> str:
        return self._search(f"{prof} {name}" if prof else name,
                            f"{name} ({prof})" if prof else name, out)

    @staticmethod
    def _fact(text: str, key: str) -> str | None:
        m = _FACTS[key].search(text)
        if m is None:
            if key == "founder":
                c = _CLASSIC_FOUNDER.search(text)
                return c.group(1) if c else None
            return None
        return next((g for g in m.groups() if g), None)

    @staticmethod
    def _founder(text: str) -> tuple[str | None, str | None, str | None]:
        """(profession, name or alias, birth year) of the founder an organisation names."""
        m = _FACTS["founder"].search(text)
        if m is None:
            c = _CLASSIC_FOUNDER.search(text)
            return (None, c.group(1), None) if c else (None, None, None)
        g = m.groups()
        return (g[0], g[1], g[2]) if g[1] else (g[3], g[4], g[5])

    def _country_of_birth(self, text: str, out: ScriptedAnswer) -> str | None:
        m = _FACTS["born_city"].search(text)
        if m is None:
            return None
        if m.group(2):
            return m.group(2)
        return self._fact(self._search(m.group(1), m.group(1), out), "country")

    def _plan(self, qtype: str, mentions: Sequence[tuple[str | None, str]],
              out: ScriptedAnswer) -> str | None:
        prof, name = mentions[0]
        if qtype.startswith("compare_"):
            if len(mentions) < 2:
                return None
            key = "founded_year" if qtype == "compare_org_founded" else "born_year"
            years = []
            for p, n in mentions[:2]:
                text = self._person(p, n, out) if p else self._search(n, n, out)
                years.append(self._fact(text, key))
            if None in years:
                return mentions[0][1]
            return mentions[0][1] if int(years[0] or 0) <= int(years[1] or 0) else mentions[1][1]
        if qtype.startswith("person_"):
            text = self._person(prof, name, out)
            if qtype == "person_birth_city":
                return self._fact(text, "born_city")
            if qtype == "person_birth_year":
                return self._fact(text, "born_year")
            country = self._country_of_birth(text, out)
            if qtype == "person_birth_country" or country is None:
                return country
            return self._fact(self._search(country, country, out), "capital")
        if qtype == "city_country":
            return self._fact(self._search(name, name, out), "country")
        if qtype == "country_capital":
            return self._fact(self._search(name, name, out), "capital")
        org = self._search(name, name, out)
        if qtype == "org_hq_city":
            return self._fact(org, "hq")
        if qtype == "org_founded_year":
            return self._fact(org, "founded_year")
        if qtype == "org_hq_country":
            hq = self._fact(org, "hq")
            return self._fact(self._search(hq, hq, out), "country") if hq else None
        f_prof, f_name, f_year = self._founder(org)
        if f_name is None:
            return None
        if qtype == "org_founder_birth_year" and f_year:
            return f_year
        if qtype == "org_founder" and " " in f_name and not f_prof:
            return f_name
        person = self._person(f_prof, f_name, out)
        if qtype == "org_founder":
            # An alias: the person's passage opens with their full name ("<title>. ...").
            title = person.split(".", 1)[0]
            return title.split(" (", 1)[0] or f_name
        if qtype == "org_founder_birth_city":
            return self._fact(person, "born_city")
        if qtype == "org_founder_birth_year":
            return self._fact(person, "born_year")
        return self._country_of_birth(person, out)
