"""What every synthetic world is made of: the World record, the made-up names its entities get,
and the writer of its corpus and splits. The `classic` (datasets/synthetic.py) and `reading`
(datasets/reading_world.py) generators both build on it, so neither imports the other's internals.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from searchrl.datasets.io import write_jsonl
from searchrl.types import Passage, QAExample

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "gr", "kr", "tr", "vr", "sk", "st", "th", "sh", "ch"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou", "ia"]
_CODAS = ["", "", "n", "r", "l", "s", "m", "th", "x", "nd", "rk"]
PROFESSIONS = ["painter", "engineer", "botanist", "composer", "cartographer", "sculptor",
               "physician", "novelist", "astronomer", "architect"]
INDUSTRIES = ["shipbuilding", "textiles", "printing", "glassworks", "software", "mining",
              "publishing", "brewing", "aviation", "pharmaceuticals"]
ORG_KINDS = ("Works", "Guild", "Company", "Institute")


def made_up_word(rng: random.Random, syllables: int) -> str:
    """A pronounceable name that is no real word: facts about it exist only in the corpus."""
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def unique_names(
    rng: random.Random, n: int, make: Callable[[], str], taken: set[str]
) -> list[str]:
    """`n` names from `make` that no entity of the world has yet (recorded in `taken`)."""
    names: list[str] = []
    while len(names) < n:
        name = make()
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


@dataclass(frozen=True)
class Geography:
    """The places and people's names every synthetic world starts from."""

    cities: dict[str, str]  # city -> country
    capitals: dict[str, str]  # country -> capital city
    countries: list[str]  # in drawing order
    city_names: list[str]  # in drawing order
    people: list[str]  # "First Last", in drawing order


def draw_geography(n_countries: int, n_cities: int, n_people: int, rng: random.Random,
                   taken: set[str]) -> Geography:
    """Countries ("...ia"), cities (every country gets one first: its capital), and people's
    two-word names, all unique across the world (`taken`), drawn from `rng` in a fixed order:
    both world profiles call this first, so a seed gives the same places in both."""
    countries = unique_names(rng, n_countries, lambda: made_up_word(rng, 2) + "ia", taken)
    city_names = unique_names(rng, n_cities, lambda: made_up_word(rng, rng.choice([2, 3])),
                              taken)
    cities: dict[str, str] = {}
    for i, city in enumerate(city_names):
        # Round-robin first so every country has a city (its capital), then random.
        cities[city] = countries[i] if i < len(countries) else rng.choice(countries)
    capitals = {country: next(c for c, k in cities.items() if k == country)
                for country in countries}
    people = unique_names(
        rng, n_people,
        lambda: f"{made_up_word(rng, 2)} {made_up_word(rng, rng.choice([2, 3]))}", taken)
    return Geography(cities, capitals, countries, city_names, people)


@dataclass
class World:
    people: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> born_in, profession
    cities: dict[str, str] = field(default_factory=dict)  # city -> country
    capitals: dict[str, str] = field(default_factory=dict)  # country -> capital city
    orgs: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> founder, hq, industry
    split_of: dict[str, str] = field(default_factory=dict)  # anchor entity -> split
    passages: list[Passage] = field(default_factory=list)
    doc_of: dict[str, str] = field(default_factory=dict)  # entity -> its passage id
    splits: dict[str, list[QAExample]] = field(default_factory=dict)


def write_world(world: World, out_dir: str | Path) -> dict[str, Path]:
    """Write corpus.jsonl and {train,dev,test}.jsonl with manifests; return split -> path."""
    out = Path(out_dir)
    paths = {"corpus": out / "corpus.jsonl"}
    write_jsonl(paths["corpus"], world.passages)
    for split, rows in world.splits.items():
        paths[split] = out / f"{split}.jsonl"
        write_jsonl(paths[split], rows)
    return paths
