"""The `classic` synthetic world (kept for regression; the default is the `reading` world of
datasets/reading_world.py): fictional entities whose facts exist only in the corpus, so a policy
that does not search cannot beat chance. One question phrasing and one passage sentence per
relation: a fixed regex script scores EM 1.000 on it (issue 33), so it cannot show that a
policy learned to read or search.

Entities: people, cities, countries, organisations. Relations: person born_in city,
city located_in country, country capital city, organisation founded_by person,
organisation headquartered_in city. Each entity gets an encyclopedia-style passage; each
person and organisation also gets a distractor: a near-namesake with different facts.

Questions chain 1-3 relations. Splits are made by *anchor entity* (the person or
organisation a question starts from, founders follow their organisation), so the facts a
test question starts from never appear in a train question. Answers do repeat across splits
(141 of the demo world's 150 test answers are also train answers: a city is many people's
birth city), so recalling frequent answers is a shortcut this world does not rule out.
"""

from __future__ import annotations

import random

from searchrl.config import SyntheticWorldConfig
from searchrl.datasets.reading_world import generate_reading_world
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

SYNTHETIC_TYPES = (
    "person_birth_city", "city_country", "country_capital", "org_founder", "org_hq_city",
    "person_birth_country", "org_founder_birth_city", "org_hq_country",
    "org_founder_birth_country", "person_birth_country_capital",
)


def _build_entities(cfg: SyntheticWorldConfig, rng: random.Random) -> World:
    world = World()
    taken: set[str] = set()
    geo = draw_geography(cfg.n_countries, cfg.n_cities, cfg.n_people, rng, taken)
    world.cities, world.capitals = geo.cities, geo.capitals
    countries, cities, people = geo.countries, geo.city_names, geo.people
    for person in people:
        world.people[person] = {"born_in": rng.choice(cities),
                                "profession": rng.choice(PROFESSIONS)}
    orgs = unique_names(
        rng, cfg.n_organisations,
        lambda: f"{made_up_word(rng, 2)} {rng.choice(ORG_KINDS)}",
        taken,
    )
    # Split anchors: each organisation takes a founder that no other organisation has, and the
    # founder follows the organisation's split.
    founders = rng.sample(people, k=min(len(orgs), len(people)))
    splits = ("train", "dev", "test")
    weights = (cfg.n_train, cfg.n_dev, cfg.n_test)
    for org, founder in zip(orgs, founders, strict=False):
        world.orgs[org] = {"founder": founder, "hq": rng.choice(cities),
                           "industry": rng.choice(INDUSTRIES)}
        split = rng.choices(splits, weights=weights)[0]
        world.split_of[org] = split
        world.split_of[founder] = split
    for person in people:
        world.split_of.setdefault(person, rng.choices(splits, weights=weights)[0])
    for city in cities:
        world.split_of.setdefault(city, rng.choices(splits, weights=weights)[0])
    for country in countries:
        world.split_of.setdefault(country, rng.choices(splits, weights=weights)[0])
    return world


def _render_passages(world: World, cfg: SyntheticWorldConfig, rng: random.Random) -> None:
    def add(entity: str | None, title: str, text: str) -> None:
        pid = f"syn{len(world.passages):05d}"
        world.passages.append(Passage(id=pid, title=title, contents=f"{title}. {text}"))
        if entity is not None:
            world.doc_of[entity] = pid

    for person, facts in world.people.items():
        add(person, person, f"{person} is a {facts['profession']}. "
                            f"{person} was born in {facts['born_in']}.")
    for city, country in world.cities.items():
        add(city, city, f"{city} is a city located in {country}.")
    for country, capital in world.capitals.items():
        add(country, country, f"{country} is a country. The capital of {country} is {capital}.")
    for org, facts in world.orgs.items():
        add(org, org, f"{org} is a {facts['industry']} organisation founded by "
                      f"{facts['founder']}. It is headquartered in {facts['hq']}.")
    # Distractors: near-namesakes with different facts, so retrieval and reading must be exact.
    cities = list(world.cities)
    taken_titles = {p.title for p in world.passages if p.title}
    for _ in range(cfg.distractors_per_entity):
        for person, facts in world.people.items():
            first, last = person.split(" ", 1)
            twin = f"{first} {last}son"
            other = rng.choice([c for c in cities if c != facts["born_in"]])
            add(None, twin, f"{twin} is a {rng.choice(PROFESSIONS)}. {twin} was born in {other}.")
        for org, facts in world.orgs.items():
            twin = _org_twin(org, taken_titles, rng)
            other = rng.choice([c for c in cities if c != facts["hq"]])
            add(None, twin, f"{twin} is a {rng.choice(INDUSTRIES)} organisation. "
                            f"It is headquartered in {other}.")


def _org_twin(org: str, taken: set[str], rng: random.Random) -> str:
    """A near-namesake of `org`: same name word, another kind ("Vodrond Company" ->
    "Vodrond Guild"), unique among titles. Never the whole name plus a word: "New Vodrond
    Company" holds every query word of "Vodrond Company" in a shorter passage, so BM25 ranked
    it above the organisation's own passage for every organisation (issue 25)."""
    word, kind = org.rsplit(" ", 1)
    kinds = [k for k in ORG_KINDS if k != kind]
    rng.shuffle(kinds)
    for twin in [f"{word} {k}" for k in kinds] + [f"{word}son {kind}"]:
        if twin not in taken:
            taken.add(twin)
            return twin
    raise ValueError(f"synthetic world: no free distractor title for organisation {org!r} "
                     f"(each organisation has {len(ORG_KINDS)}); lower "
                     "data.synthetic.distractors_per_entity")


def _candidate_questions(world: World) -> list[tuple[str, int, str, str, list[str], str]]:
    """(anchor, hops, type, question, supporting entities, answer) for every template."""
    out: list[tuple[str, int, str, str, list[str], str]] = []
    for p, f in world.people.items():
        city = f["born_in"]
        country = world.cities[city]
        out.append((p, 1, "person_birth_city", f"In which city was {p} born?", [p], city))
        out.append((p, 2, "person_birth_country", f"In which country was {p} born?",
                    [p, city], country))
        out.append((p, 3, "person_birth_country_capital",
                    f"What is the capital of the country where {p} was born?",
                    [p, city, country], world.capitals[country]))
    for c, k in world.cities.items():
        out.append((c, 1, "city_country", f"Which country is {c} located in?", [c], k))
    for k, cap in world.capitals.items():
        out.append((k, 1, "country_capital", f"What is the capital of {k}?", [k], cap))
    for o, f in world.orgs.items():
        founder, hq = f["founder"], f["hq"]
        born = world.people[founder]["born_in"]
        out.append((o, 1, "org_founder", f"Who founded {o}?", [o], founder))
        out.append((o, 1, "org_hq_city", f"In which city is {o} headquartered?", [o], hq))
        out.append((o, 2, "org_hq_country", f"In which country is {o} headquartered?",
                    [o, hq], world.cities[hq]))
        out.append((o, 2, "org_founder_birth_city", f"In which city was the founder of {o} born?",
                    [o, founder], born))
        out.append((o, 3, "org_founder_birth_country",
                    f"In which country was the founder of {o} born?",
                    [o, founder, born], world.cities[born]))
    return out


def _make_splits(world: World, cfg: SyntheticWorldConfig, rng: random.Random) -> None:
    wanted = {"train": cfg.n_train, "dev": cfg.n_dev, "test": cfg.n_test}
    by_split_hop: dict[tuple[str, int], list[tuple[str, int, str, str, list[str], str]]] = {}
    for cand in _candidate_questions(world):
        by_split_hop.setdefault((world.split_of[cand[0]], cand[1]), []).append(cand)
    for split, n in wanted.items():
        chosen: list[tuple[str, int, str, str, list[str], str]] = []
        hops = sorted(cfg.hop_mix)
        quotas = {h: round(n * cfg.hop_mix[h]) for h in hops}
        for h in hops:
            pool = by_split_hop.get((split, h), [])
            rng.shuffle(pool)
            chosen.extend(pool[: quotas[h]])
        rng.shuffle(chosen)
        world.splits[split] = [
            QAExample(
                id=f"{split}-{i:05d}", question=q, golden_answers=(answer,), hops=hops_,
                type=qtype, supporting_doc_ids=tuple(world.doc_of[e] for e in support),
            )
            for i, (_, hops_, qtype, q, support, answer) in enumerate(chosen)
        ]


def generate_world(cfg: SyntheticWorldConfig) -> World:
    """Build the world of `cfg.profile` (`reading`: datasets/reading_world.py), its corpus and its
    splits; the same config always gives the same output."""
    if cfg.profile == "reading":
        return generate_reading_world(cfg)
    rng = random.Random(cfg.seed)
    world = _build_entities(cfg, rng)
    _render_passages(world, cfg, rng)
    _make_splits(world, cfg, rng)
    return world
