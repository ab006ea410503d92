"""The `scripted` system: the strongest fixed program we could write from the train split with
every component the project ships (the retriever the policy searches with and the MiniLM
sentence encoder), learning nothing beyond what it reads from the train split and the corpus.
The gate's "trained beats a fixed script" condition compares with it (issue 43, section 3).
Its predecessor (regular expressions over train's literal question templates, issue 33) is
`eval/scripted_regex.py`, kept only for the side-by-side of benchmarks/bench_scripted.py.

How it answers a question:
1. Entities, from the corpus: search each capitalised run of the question; the names the
   hits' passages use (their titles, and every capitalised name inside a sentence, which
   covers the aliases a passage introduces, "X, known as A") that occur in the question are
   its entities, longest first; "the <profession> X" where a hit is titled "X (<profession>)"
   (a namesake). Capitalisation only makes the queries: "Tell me ..." or "Of A and B ..."
   name no entity unless the corpus uses that name.
2. Question type, by meaning: the question with its entities replaced by "X" is
   embedded with the shipped encoder and takes the type of its nearest train question
   (cosine), among the types whose train questions name as many entities, of the same kind.
   Kinds are learnt, not listed: types whose train questions start from the same passage are
   one kind (people, organisations, cities, countries); a passage is of the kind of the train
   anchor passage whose words it shares most. So an unseen phrasing ("Tell me the nation X
   arrived in") is read by what it means and whom it asks about, not by its literal words.
3. A fixed plan per type, the retriever's searches read with the regular expressions below
   (the corpus's sentence forms): search the entity (a namesake by profession and name),
   follow a founder named by an alias or profession with a second search, stop early when the
   passage already holds the fact (a founder's birth year in the organisation's passage, a
   birth city's country in the person's), compare two years.

On other data (HotpotQA) no fact pattern matches and it answers nothing right.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from searchrl.config import IndexConfig
from searchrl.config.index import BUNDLED_ENCODER
from searchrl.retrieval.base import Searcher
from searchrl.retrieval.dense import Encoder
from searchrl.types import QAExample, SearchHit

_NAME = r"[A-Z][a-z]+(?: [A-Z][a-z]+)?"
_WORD = re.compile(r"[a-z]+")
_CAPITALISED = re.compile(r"[A-Z][a-z]+(?: [A-Z][a-z]+)*")
_SENTENCE_END = re.compile(r"(?:^|[.!?]\s+)$")
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
QUESTION_HITS = 10  # hits of the question search that entity names are read from
# What an entity becomes in the embedded question. A made-up name ("Zorb") looked better in a
# type-accuracy proxy but scored lower EM on all four tuning splits (benchmarks/bench_scripted.py:
# 101 dev 0.973 against 0.977, 102 dev 0.957 against 0.963): "X" it is.
SLOT = "X"

Mention = tuple[str | None, str]  # (profession of a namesake or None, name)


@dataclass
class ScriptedAnswer:
    answer: str | None
    queries: list[str] = field(default_factory=list)
    retrieved_doc_ids: list[str] = field(default_factory=list)
    top_score: float | None = None
    qtype: str | None = None  # the type the script decided on
    latency_s: float = 0.0


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Encode on one thread: a short question gains nothing from more, on a shared CPU extra
    intra-op threads cost 20x (measured: 47 ms against 1.1 s a question on 2 busy cores), and
    the vectors then do not depend on the machine's thread count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _embed(encoder: Encoder, texts: Sequence[str]) -> NDArray[np.float32]:
    with _one_torch_thread():
        return encoder.encode_queries(texts)


def default_encoder() -> Encoder:
    """The shipped MiniLM on CPU in float32: the same answers on every machine."""
    return Encoder(IndexConfig(encoder=BUNDLED_ENCODER, encoder_device="cpu",
                               encoder_dtype="float32"))


# --- entities, read from the corpus


def _base(title: str) -> str:
    return title.split(" (", 1)[0]


def _names_in(hit: SearchHit) -> set[str]:
    """The names a passage uses: its title and every capitalised name not opening a sentence
    (a sentence's first word is capitalised whatever it is)."""
    names = {_base(hit.title)} if hit.title else set()
    for m in _CAPITALISED.finditer(hit.contents):
        if not _SENTENCE_END.search(hit.contents[:m.start()]):
            names.add(m.group())
    return names


def find_mentions(question: str, hits: Sequence[SearchHit]) -> list[tuple[Mention, int, int]]:
    """((profession, name), start, end) of each entity the question names, in order: the
    longest names the hits' passages use first, never overlapping."""
    titles = {h.title for h in hits if h.title}
    taken: list[tuple[Mention, int, int]] = []
    for name in sorted(set().union(*map(_names_in, hits)) if hits else set(),
                       key=lambda n: (-len(n), n)):
        for m in re.finditer(rf"(?<![A-Za-z]){re.escape(name)}(?![A-Za-z])", question):
            if any(m.start() < e and s < m.end() for _, s, e in taken):
                continue
            start, prof = m.start(), None
            before = re.search(r"\b[Tt]he ([a-z]+) $", question[:start])
            if before and f"{name} ({before.group(1)})" in titles:
                prof, start = before.group(1), before.start()
            taken.append(((prof, name), start, m.end()))
    return sorted(taken, key=lambda t: t[1])


def _entity_hit(mention: Mention, hits: Sequence[SearchHit]) -> SearchHit | None:
    """The passage about a mention: titled by it, else the one introducing it as an alias
    (in its first two sentences), else the first that names it."""
    prof, name = mention
    title = f"{name} ({prof})" if prof else name
    for h in hits:
        if h.title == title:
            return h
    for h in hits:
        if name in ". ".join(h.contents.split(". ")[:2]):
            return h
    return next((h for h in hits if name in h.contents), None)


def _masked(question: str, mentions: Sequence[tuple[Mention, int, int]]) -> str:
    for _, start, end in reversed(mentions):
        question = question[:start] + SLOT + question[end:]
    return question


def _shape(text: str) -> frozenset[str]:
    """A passage's lower-case words: what it says, not whom it names."""
    return frozenset(_WORD.findall(_CAPITALISED.sub(" ", text)))


class FixedReader:
    """The reading half of a fixed program: per question type a fixed plan of searches,
    facts read from the passages with patterns over the corpus's sentence forms, hops chained,
    years compared. Subclasses say how a question is understood (`understand`: its type and
    entities); `ScriptedSystem` is the pipeline's, `scripted_regex.RegexScriptedSystem` the
    regex program it replaced."""

    searcher: Searcher
    top_k: int

    def understand(self, question: str) -> tuple[str | None, list[Mention]]:
        raise NotImplementedError

    def qtype(self, question: str) -> str | None:
        return self.understand(question)[0]

    def answer(self, question: str) -> ScriptedAnswer:
        started = time.perf_counter()
        qtype, mentions = self.understand(question)
        out = ScriptedAnswer(answer=None, qtype=qtype)
        if qtype is not None and mentions:
            out.answer = self._plan(qtype, mentions, out)
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

    def _plan(self, qtype: str, mentions: Sequence[Mention], out: ScriptedAnswer) -> str | None:
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


class ScriptedSystem(FixedReader):
    """Answers questions with fixed plans; question types learnt from `train` only (its
    questions, and the passages its questions start from, as the searcher returns them)."""

    def __init__(self, train: Sequence[QAExample], searcher: Searcher, top_k: int = 3,
                 encoder: Encoder | None = None) -> None:
        self.searcher = searcher
        self.top_k = top_k
        self.encoder = encoder or default_encoder()
        questions: list[str] = []
        self.types: list[str] = []
        n_entities: dict[str, Counter[int]] = {}
        anchors: dict[str, set[str]] = {}  # anchor passage id -> types asked from it
        shapes: dict[str, frozenset[str]] = {}
        for ex in train:
            if ex.type is None:
                continue
            hits = self._hits(ex.question)
            mentions = find_mentions(ex.question, hits)
            if not mentions:
                continue
            questions.append(_masked(ex.question, mentions))
            self.types.append(ex.type)
            n_entities.setdefault(ex.type, Counter())[len(mentions)] += 1
            for mention, _, _ in mentions:
                hit = _entity_hit(mention, hits)
                if hit is not None:
                    anchors.setdefault(hit.doc_id, set()).add(ex.type)
                    shapes[hit.doc_id] = _shape(hit.contents)
        self.n_entities = {t: c.most_common(1)[0][0] for t, c in n_entities.items()}
        self.kind = _kinds(anchors.values())
        self.anchor_shapes = [(shapes[d], self.kind[min(ts)]) for d, ts in sorted(anchors.items())]
        self.vectors: NDArray[np.float32] = (_embed(self.encoder, questions) if questions
                                             else np.zeros((0, 1), np.float32))

    # --- understanding the question

    def _hits(self, question: str) -> list[SearchHit]:
        """Hits for each capitalised run of the question (a name, perhaps with a capitalised
        first word: "Of Zorb Quux"): the question as a whole ranks passages sharing its
        common words ("nation", "town") above the one it names."""
        runs = list(dict.fromkeys(m.group() for m in _CAPITALISED.finditer(question)))
        if not runs:
            return []
        hits: dict[str, SearchHit] = {}
        for found in self.searcher.search_batch(runs, QUESTION_HITS):
            for h in found:
                hits.setdefault(h.doc_id, h)
        return list(hits.values())

    def passage_kind(self, text: str) -> int | None:
        """The kind of the train anchor passage sharing the most words with `text`."""
        shape = _shape(text)
        best = max(self.anchor_shapes, default=None,
                   key=lambda a: len(shape & a[0]) / (len(shape | a[0]) or 1))
        return best[1] if best is not None else None

    def understand(self, question: str) -> tuple[str | None, list[Mention]]:
        """(question type, entities) of a question."""
        hits = self._hits(question)
        found = find_mentions(question, hits)
        mentions = [m for m, _, _ in found]
        if not found or not self.types:
            return None, mentions
        first = _entity_hit(mentions[0], hits)
        kind = self.passage_kind(first.contents) if first is not None else None
        allowed = {t for t, n in self.n_entities.items()
                   if n == len(mentions) and (kind is None or self.kind[t] == kind)}
        vector = _embed(self.encoder, [_masked(question, found)])[0]
        scores = self.vectors @ vector
        order = np.argsort(-scores, kind="stable")
        best = next((self.types[i] for i in order if self.types[i] in allowed),
                    self.types[int(order[0])])
        return best, mentions


def _kinds(groups: Iterable[set[str]]) -> dict[str, int]:
    """Types asked from a common passage are one kind (union-find): kind id per type."""
    parent: dict[str, str] = {}

    def root(t: str) -> str:
        while parent.setdefault(t, t) != t:
            t = parent[t]
        return t

    for types in groups:
        first, *rest = sorted(types)
        root(first)
        for t in rest:
            parent[root(t)] = root(first)
    roots = sorted({root(t) for t in parent})
    return {t: roots.index(root(t)) for t in parent}
