"""The `reading` synthetic world: fictional facts that exist only in the corpus, written so
that answering takes reading and searching, not one regular expression per relation.

What makes it harder than the `classic` world (datasets/synthetic.py), each a named slice a
question is tagged with (`QAExample.slices`; `SLICE_CARD` says what each tests):

- phrasings: every question type has 6 question forms; the train split uses forms 0-1 only,
  dev and test all six, so about 2 in 3 held-out questions are in a phrasing no training
  question (of this world or the cold start's extra worlds) ever used (`unseen_phrasing`).
  Every fact is written in one of 3 sentence forms, drawn per passage.
- aliases: some organisations and people have a short name their passage introduces; some
  questions, and some other passages (an organisation naming its founder), use it (`alias`):
  the name to search is the alias, the answer the full name.
- namesakes: some people share a name and differ by profession ("the botanist X" and "the
  composer X"); the question or the organisation's passage says which (`namesake`).
- facts outside the entity's own passage: an organisation's passage may give its founder's
  birth year, a person's passage the country of their birth city (`cross_passage`): one
  search instead of two, if the policy reads what it already has.
- comparisons: which of two organisations was founded earlier, which of two people was born
  earlier (`comparison`): two searches, two years compared, one of the two names answered.
- `answer_novel`: a held-out question whose answer is no train question's answer; dev and
  test hold at least `NOVEL_SHARE` of them.

Splits are made by anchor entity (a person, an organisation, a city, a country; both of a
comparison's; a founder follows their organisation): the facts a held-out question starts
from appear in no train question. Answers can repeat across splits (a city is many people's
birth city), which is why the answer-novel slice is measured on its own.

Over 400 lines because entities, slices, phrasings and splits are drawn together from one seed;
the card (`SLICE_CARD`) and the split rule must agree with what is generated.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from searchrl.config import SyntheticWorldConfig
from searchrl.datasets.world import (
    INDUSTRIES,
    ORG_KINDS,
    PROFESSIONS,
    World,
    draw_geography,
    made_up_word,
    unique_names,
)
from searchrl.types import Passage, QAExample

TRAIN_FORMS = (0, 1)  # question forms the train split (and every cold-start world) uses
N_FORMS = 6
NOVEL_SHARE = 0.35  # held-out questions whose answer is no train answer, at least (if any)

SLICE_CARD: dict[str, str] = {
    "unseen_phrasing": "question worded in a form no training question used (forms 2-5 of "
                       "6): reading the question, not matching a template",
    "answer_novel": "the answer is no train question's answer: copying a name from what was "
                    "read, not recalling a trained answer",
    "alias": "the question or a passage names an entity by the short name its own passage "
             "introduces: search the alias, answer the full name",
    "namesake": "two people share the name; the profession in the question or passage tells "
                "them apart: search the right one",
    "cross_passage": "the fact is already in the first passage read (a founder's birth year "
                     "in the organisation's passage, a birth city's country in the person's): "
                     "stop searching once it is read",
    "comparison": "which of two organisations was founded / people was born earlier: two "
                  "searches and a comparison of years, one of the two names answered",
}

READING_TYPES = (
    "person_birth_city", "person_birth_year", "city_country", "country_capital",
    "org_founder", "org_hq_city", "org_founded_year", "person_birth_country",
    "org_hq_country", "org_founder_birth_city", "org_founder_birth_year",
    "org_founder_birth_country", "person_birth_country_capital", "compare_org_founded",
    "compare_person_born",
)

# {X}: the entity as the question names it; {A} / {B}: a comparison's two names.
QUESTION_FORMS: dict[str, tuple[str, ...]] = {
    "person_birth_city": (
        "In which city was {X} born?", "Where was {X} born?", "What is the hometown of {X}?",
        "{X} is a native of which city?", "Name the birthplace of {X}.",
        "Tell me where {X} first saw daylight."),
    "person_birth_year": (
        "In which year was {X} born?", "When was {X} born?",
        "What is the year of birth of {X}?", "{X} came into the world in what year?",
        "Give the birth year of {X}.", "Tell me the year {X} arrived."),
    "city_country": (
        "Which country is {X} located in?", "In which country is {X}?",
        "{X} lies in which country?", "Name the country that contains {X}.",
        "Of which nation is {X} a town?", "Tell me the nation around {X}."),
    "country_capital": (
        "What is the capital of {X}?", "Which city is the capital of {X}?",
        "From which city is {X} governed?", "Name the seat of government of {X}.",
        "{X} is run from which city?", "Tell me the city that rules {X}."),
    "org_founder": (
        "Who founded {X}?", "Who is the founder of {X}?", "Who established {X}?",
        "{X} was set up by whom?", "Name the person behind the creation of {X}.",
        "Tell me who started {X}."),
    "org_hq_city": (
        "In which city is {X} headquartered?", "Where is {X} headquartered?",
        "In which city is the head office of {X}?", "{X} is based in which city?",
        "Name the city that hosts {X}.", "Tell me the home city of {X}."),
    "org_founded_year": (
        "In which year was {X} founded?", "When was {X} founded?",
        "In what year was {X} established?", "{X} dates from which year?",
        "Give the founding year of {X}.", "Tell me the year {X} started."),
    "person_birth_country": (
        "In which country was {X} born?", "Which country was {X} born in?",
        "What is the home country of {X}?", "{X} is a native of which nation?",
        "Name the country of birth of {X}.", "Tell me the nation {X} arrived in."),
    "org_hq_country": (
        "In which country is {X} headquartered?", "Which country is {X} headquartered in?",
        "In which country is the head office of {X}?", "{X} is based in which nation?",
        "Name the country that hosts {X}.", "Tell me the home nation of {X}."),
    "org_founder_birth_city": (
        "In which city was the founder of {X} born?", "Where was the founder of {X} born?",
        "What is the hometown of the person who established {X}?",
        "The person who set up {X} is a native of which city?",
        "Name the birthplace of whoever created {X}.",
        "Tell me where the one who started {X} first saw daylight."),
    "org_founder_birth_year": (
        "In which year was the founder of {X} born?", "When was the founder of {X} born?",
        "What is the year of birth of the person who established {X}?",
        "The person who set up {X} came into the world in what year?",
        "Give the birth year of whoever created {X}.",
        "Tell me the year the one who started {X} arrived."),
    "org_founder_birth_country": (
        "In which country was the founder of {X} born?",
        "Which country was the founder of {X} born in?",
        "What is the home country of the person who established {X}?",
        "The person who set up {X} is a native of which nation?",
        "Name the country of birth of whoever created {X}.",
        "Tell me the nation the one who started {X} arrived in."),
    "person_birth_country_capital": (
        "What is the capital of the country where {X} was born?",
        "Which city is the capital of the country {X} was born in?",
        "From which city is the home country of {X} governed?",
        "Name the seat of government of the country of birth of {X}.",
        "The nation {X} is a native of is run from which city?",
        "Tell me the city that rules the nation {X} arrived in."),
    "compare_org_founded": (
        "Which was founded earlier, {A} or {B}?", "Which is older, {A} or {B}?",
        "Which was established first: {A} or {B}?",
        "Of {A} and {B}, which dates from an earlier year?",
        "Name the older organisation: {A} or {B}.",
        "Tell me which started sooner, {A} or {B}."),
    "compare_person_born": (
        "Who was born earlier, {A} or {B}?", "Who is older, {A} or {B}?",
        "Whose year of birth comes first: {A} or {B}?",
        "Of {A} and {B}, who came into the world first?", "Name the elder: {A} or {B}.",
        "Tell me who arrived sooner, {A} or {B}."),
}

# Passage sentence forms, 3 per fact; {S} the subject as the passage names it.
BORN_CITY = ("{S} was born in {C}.", "{S}'s hometown is {C}.", "{S} is a native of {C}.")
BORN_YEAR = ("{S} was born in the year {Y}.", "{S}'s year of birth is {Y}.",
             "{S} came into the world in {Y}.")
CITY_COUNTRY = ("{C} is a city located in {K}.", "{C} lies in {K}.",
                "{C} is a town of the nation of {K}.")
CAPITAL = ("The capital of {K} is {C}.", "{K} is governed from {C}.",
           "{C} is the seat of government of {K}.")
FOUNDER = ("It was founded by {F}.", "{F} established it.", "Its founder is {F}.")
FOUNDED_YEAR = ("It was founded in {Y}.", "It dates from {Y}.", "It was established in {Y}.")
HQ = ("It is headquartered in {C}.", "Its head office is in {C}.", "It is based in {C}.")


@dataclass
class Person:
    name: str
    profession: str
    born_in: str
    year: int
    alias: str | None = None
    namesake: bool = False  # shares `name` with another person: always named with profession

    @property
    def title(self) -> str:
        return f"{self.name} ({self.profession})" if self.namesake else self.name

    @property
    def mention(self) -> str:
        """How a question or another passage names them unambiguously."""
        return f"the {self.profession} {self.name}" if self.namesake else self.name

    @property
    def query(self) -> str:
        return f"{self.profession} {self.name}" if self.namesake else self.name


@dataclass
class Org:
    name: str
    founder: int  # index into ReadingWorld.persons
    hq: str
    year: int
    industry: str
    alias: str | None = None
    founder_by_alias: bool = False  # its passage names the founder by their alias
    founder_year_here: bool = False  # its passage gives the founder's birth year


@dataclass
class ReadingWorld(World):
    persons: list[Person] = field(default_factory=list)
    organisations: list[Org] = field(default_factory=list)
    country_in_person_passage: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _Candidate:
    anchor: tuple[str, ...]
    hops: int
    qtype: str
    names: tuple[str, ...]  # {X}, or {A} and {B}
    support: tuple[str, ...]  # passage ids, in search order
    queries: tuple[str, ...]
    answer: str
    slices: tuple[str, ...]


def _build(cfg: SyntheticWorldConfig, rng: random.Random) -> ReadingWorld:
    world = ReadingWorld()
    taken: set[str] = set()
    geo = draw_geography(cfg.n_countries, cfg.n_cities, cfg.n_people, rng, taken)
    world.cities, world.capitals = geo.cities, geo.capitals
    countries, cities, names = geo.countries, geo.city_names, geo.people
    aliases = iter(unique_names(rng, cfg.n_people + cfg.n_organisations,
                                lambda: made_up_word(rng, 2), taken))
    for name in names:
        world.persons.append(Person(name, rng.choice(PROFESSIONS), rng.choice(cities),
                                    rng.randint(1700, 1980),
                                    alias=next(aliases) if rng.random() < 0.25 else None))
    # Namesakes: one person in eight gets a twin of another profession.
    for person in list(world.persons):
        if rng.random() < 0.125:
            person.namesake = True
            other = rng.choice([p for p in PROFESSIONS if p != person.profession])
            world.persons.append(Person(person.name, other, rng.choice(cities),
                                        rng.randint(1700, 1980), namesake=True))
    org_names = unique_names(rng, cfg.n_organisations,
                             lambda: f"{made_up_word(rng, 2)} {rng.choice(ORG_KINDS)}", taken)
    founders = rng.sample(range(len(world.persons)), k=min(len(org_names), len(world.persons)))
    for org_name, founder in zip(org_names, founders, strict=False):
        # Founded 20-60 years after its founder's birth.
        world.organisations.append(Org(
            org_name, founder, rng.choice(cities),
            world.persons[founder].year + rng.randint(20, 60),
            rng.choice(INDUSTRIES), alias=next(aliases) if rng.random() < 0.3 else None,
            founder_by_alias=world.persons[founder].alias is not None and rng.random() < 0.7,
            founder_year_here=rng.random() < 0.4))
    world.country_in_person_passage = {i for i in range(len(world.persons))
                                       if rng.random() < 0.3}
    # Legacy views (World): people by title, orgs by name.
    for p in world.persons:
        world.people[p.title] = {"born_in": p.born_in, "profession": p.profession}
    for o in world.organisations:
        world.orgs[o.name] = {"founder": world.persons[o.founder].title, "hq": o.hq,
                              "industry": o.industry}
    splits = ("train", "dev", "test")
    weights = (cfg.n_train, cfg.n_dev, cfg.n_test)
    for o in world.organisations:
        split = rng.choices(splits, weights=weights)[0]
        world.split_of[o.name] = split
        world.split_of[world.persons[o.founder].title] = split
    for entity in [p.title for p in world.persons] + cities + countries:
        world.split_of.setdefault(entity, rng.choices(splits, weights=weights)[0])
    return world


def _a(word: str) -> str:
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _render(world: ReadingWorld, rng: random.Random) -> None:
    def add(entity: str, title: str, sentences: Sequence[str]) -> None:
        pid = f"syn{len(world.passages):05d}"
        world.passages.append(Passage(id=pid, title=title,
                                      contents=f"{title}. " + " ".join(sentences)))
        world.doc_of[entity] = pid

    for i, p in enumerate(world.persons):
        subject = p.alias or p.name
        intro = (f"{p.name}, known as {p.alias}, is {_a(p.profession)}." if p.alias
                 else f"{p.name} is {_a(p.profession)}.")
        born = rng.choice(BORN_CITY).format(S=subject, C=p.born_in)
        if i in world.country_in_person_passage:
            born = born[:-1] + f", in {world.cities[p.born_in]}."
        add(p.title, p.title, [intro, born, rng.choice(BORN_YEAR).format(S=subject, Y=p.year)])
    for city, country in world.cities.items():
        add(city, city, [rng.choice(CITY_COUNTRY).format(C=city, K=country)])
    for country, capital in world.capitals.items():
        add(country, country, [f"{country} is a country.",
                               rng.choice(CAPITAL).format(K=country, C=capital)])
    for o in world.organisations:
        founder = world.persons[o.founder]
        named = founder.alias if o.founder_by_alias and founder.alias else founder.mention
        if o.founder_year_here:
            named = f"{named} (born {founder.year})"
        intro = (f"{o.name}, called {o.alias} for short, is {_a(o.industry)} organisation."
                 if o.alias else f"{o.name} is {_a(o.industry)} organisation.")
        add(o.name, o.name, [intro, rng.choice(FOUNDER).format(F=named),
                             rng.choice(FOUNDED_YEAR).format(Y=o.year),
                             rng.choice(HQ).format(C=o.hq)])


def _candidates(world: ReadingWorld, rng: random.Random, comparisons: int) -> list[_Candidate]:
    doc = world.doc_of
    out: list[_Candidate] = []

    for i, p in enumerate(world.persons):
        named = p.mention
        # The person's passage states its facts of an aliased person by the alias.
        sup, qs = [doc[p.title]], [p.query]
        sl = [*(["namesake"] if p.namesake else []), *(["alias"] if p.alias else [])]
        anchor = (p.title,)
        city, country = p.born_in, world.cities[p.born_in]
        out.append(_Candidate(anchor, 1, "person_birth_city", (named,), tuple(sup), tuple(qs),
                              city, tuple(sl)))
        out.append(_Candidate(anchor, 1, "person_birth_year", (named,), tuple(sup), tuple(qs),
                              str(p.year), tuple(sl)))
        if i in world.country_in_person_passage:
            out.append(_Candidate(anchor, 2, "person_birth_country", (named,), tuple(sup),
                                  tuple(qs), country, (*sl, "cross_passage")))
        else:
            out.append(_Candidate(anchor, 2, "person_birth_country", (named,),
                                  (*sup, doc[city]), (*qs, city), country, tuple(sl)))
        chain = ((*sup, doc[country]), (*qs, country)) if i in world.country_in_person_passage \
            else ((*sup, doc[city], doc[country]), (*qs, city, country))
        out.append(_Candidate(anchor, 3, "person_birth_country_capital", (named,), chain[0],
                              chain[1], world.capitals[country],
                              (*sl, "cross_passage") if i in world.country_in_person_passage
                              else tuple(sl)))
    for city, country in world.cities.items():
        out.append(_Candidate((city,), 1, "city_country", (city,), (doc[city],), (city,),
                              country, ()))
    for country, capital in world.capitals.items():
        out.append(_Candidate((country,), 1, "country_capital", (country,), (doc[country],),
                              (country,), capital, ()))
    for o in world.organisations:
        founder = world.persons[o.founder]
        by_alias = rng.random() < 0.35 and o.alias is not None
        named = o.alias if by_alias and o.alias else o.name
        base_sl = ["alias"] if by_alias else []
        org_sup, org_q = (doc[o.name],), (named,)
        # The founder as the organisation's passage names them: the next query.
        f_alias = o.founder_by_alias and founder.alias is not None
        f_query = founder.alias if f_alias and founder.alias else founder.query
        f_sl = [*base_sl, *(["alias"] if f_alias else []),
                *(["namesake"] if founder.namesake else [])]
        f_sl = list(dict.fromkeys(f_sl))
        anchor = (o.name,)
        # The founder's full name needs their own passage when the organisation gives an alias.
        if f_alias:
            out.append(_Candidate(anchor, 1, "org_founder", (named,),
                                  (*org_sup, doc[founder.title]), (*org_q, f_query),
                                  founder.name, tuple(f_sl)))
        else:
            out.append(_Candidate(anchor, 1, "org_founder", (named,), org_sup, org_q,
                                  founder.name, tuple(dict.fromkeys(
                                      [*base_sl, *(["namesake"] if founder.namesake else [])]))))
        out.append(_Candidate(anchor, 1, "org_hq_city", (named,), org_sup, org_q, o.hq,
                              tuple(base_sl)))
        out.append(_Candidate(anchor, 1, "org_founded_year", (named,), org_sup, org_q,
                              str(o.year), tuple(base_sl)))
        out.append(_Candidate(anchor, 2, "org_hq_country", (named,), (*org_sup, doc[o.hq]),
                              (*org_q, o.hq), world.cities[o.hq], tuple(base_sl)))
        f_sup, f_q = (*org_sup, doc[founder.title]), (*org_q, f_query)
        out.append(_Candidate(anchor, 2, "org_founder_birth_city", (named,), f_sup, f_q,
                              founder.born_in, tuple(f_sl)))
        if o.founder_year_here:
            out.append(_Candidate(anchor, 2, "org_founder_birth_year", (named,), org_sup,
                                  org_q, str(founder.year), (*base_sl, "cross_passage")))
        else:
            out.append(_Candidate(anchor, 2, "org_founder_birth_year", (named,), f_sup, f_q,
                                  str(founder.year), tuple(f_sl)))
        born_country = world.cities[founder.born_in]
        if o.founder in world.country_in_person_passage:
            out.append(_Candidate(anchor, 3, "org_founder_birth_country", (named,), f_sup, f_q,
                                  born_country, (*f_sl, "cross_passage")))
        else:
            out.append(_Candidate(anchor, 3, "org_founder_birth_country", (named,),
                                  (*f_sup, doc[founder.born_in]), (*f_q, founder.born_in),
                                  born_country, tuple(f_sl)))
    out.extend(_comparisons(world, rng, comparisons))
    return out


def _comparisons(world: ReadingWorld, rng: random.Random, per_split: int) -> list[_Candidate]:
    """Pairs within one split (both anchors), distinct years; `per_split` of each kind."""
    out: list[_Candidate] = []
    doc = world.doc_of
    pairs: set[frozenset[str]] = set()  # a pair is asked once (validation flags duplicates)
    for split in ("train", "dev", "test"):
        orgs = [o for o in world.organisations if world.split_of[o.name] == split]
        people = [p for p in world.persons if world.split_of[p.title] == split]
        for _ in range(per_split if len(orgs) > 1 else 0):
            a, b = rng.sample(orgs, 2)
            if a.year == b.year or frozenset((a.name, b.name)) in pairs:
                continue
            pairs.add(frozenset((a.name, b.name)))
            out.append(_Candidate(
                (a.name, b.name), 2, "compare_org_founded", (a.name, b.name),
                (doc[a.name], doc[b.name]), (a.name, b.name),
                a.name if a.year < b.year else b.name, ("comparison",)))
        for _ in range(per_split if len(people) > 1 else 0):
            pa, pb = rng.sample(people, 2)
            if (pa.year == pb.year or pa.name == pb.name
                    or frozenset((pa.title, pb.title)) in pairs):
                continue
            pairs.add(frozenset((pa.title, pb.title)))
            slices = ("comparison", *(["namesake"] if pa.namesake or pb.namesake else []))
            out.append(_Candidate(
                (pa.title, pb.title), 2, "compare_person_born", (pa.mention, pb.mention),
                (doc[pa.title], doc[pb.title]), (pa.query, pb.query),
                (pa if pa.year < pb.year else pb).name, slices))
    return out


def _question(c: _Candidate, form: int) -> str:
    template = QUESTION_FORMS[c.qtype][form]
    if len(c.names) == 2:
        text = template.format(A=c.names[0], B=c.names[1])
    else:
        text = template.format(X=c.names[0])
    return text[0].upper() + text[1:]


def _pick(pool: list[_Candidate], n: int, rng: random.Random) -> list[_Candidate]:
    """`n` candidates spread over question types (round robin over a shuffled pool)."""
    by_type: dict[str, list[_Candidate]] = {}
    rng.shuffle(pool)
    for c in pool:
        by_type.setdefault(c.qtype, []).append(c)
    chosen: list[_Candidate] = []
    types = sorted(by_type)
    while len(chosen) < n and any(by_type.values()):
        for t in types:
            if by_type[t] and len(chosen) < n:
                chosen.append(by_type[t].pop())
    return chosen


def _make_splits(world: ReadingWorld, cfg: SyntheticWorldConfig, rng: random.Random) -> None:
    wanted = {"train": cfg.n_train, "dev": cfg.n_dev, "test": cfg.n_test}
    pools: dict[tuple[str, int], list[_Candidate]] = {}
    per_split = max(wanted.values()) // 10
    for c in _candidates(world, rng, per_split):
        splits = {world.split_of[a] for a in c.anchor}
        if len(splits) == 1:
            pools.setdefault((splits.pop(), c.hops), []).append(c)
    train_answers: set[str] = set()
    for split, n in wanted.items():
        quotas = {h: round(n * cfg.hop_mix[h]) for h in sorted(cfg.hop_mix)}
        chosen: list[_Candidate] = []
        for h, quota in quotas.items():
            pool = pools.get((split, h), [])
            if split != "train":
                # Answer-novel questions first, up to their share, then the rest.
                novel = [c for c in pool if c.answer not in train_answers]
                rest = [c for c in pool if c.answer in train_answers]
                take = _pick(novel, min(len(novel), round(quota * NOVEL_SHARE) + 1), rng)
                chosen.extend(take)
                chosen.extend(_pick(rest + [c for c in novel if c not in take],
                                    quota - len(take), rng))
            else:
                chosen.extend(_pick(pool, quota, rng))
        rng.shuffle(chosen)
        rows = []
        for i, c in enumerate(chosen):
            form = rng.choice(TRAIN_FORMS) if split == "train" else rng.randrange(N_FORMS)
            slices = list(c.slices)
            if form not in TRAIN_FORMS:
                slices.append("unseen_phrasing")
            if split != "train" and c.answer not in train_answers:
                slices.append("answer_novel")
            rows.append(QAExample(
                id=f"{split}-{i:05d}", question=_question(c, form), golden_answers=(c.answer,),
                hops=c.hops, type=c.qtype, supporting_doc_ids=c.support,
                search_queries=c.queries, slices=tuple(sorted(set(slices)))))
        world.splits[split] = rows
        if split == "train":
            train_answers = {c.answer for c in chosen}


def generate_reading_world(cfg: SyntheticWorldConfig) -> ReadingWorld:
    """The world, its corpus and its splits; the same config always gives the same output."""
    rng = random.Random(cfg.seed)
    world = _build(cfg, rng)
    _render(world, rng)
    _make_splits(world, cfg, rng)
    return world
