"""Scripted search demonstrations for the cold-start SFT, built from the gold reasoning chain.

A multi-hop question's `supporting_doc_ids` list the passages of its chain in order; the
title of passage i is the entity to search at hop i (hop 1's is in the question, later hops'
appear in the previous passage). A gold demonstration is

    prompt <think>search</think><search>E1</search><information>..hits(E1)..</information>
           <think>search</think><search>E2</search><information>..hits(E2)..</information>
           <think>answer</think><answer>X</answer><eos>

with the `<information>` blocks produced by the real searcher and the rollout loop's own
formatter, so the SFT data looks exactly like what the policy will see in rollouts.

Names go inside the tags with a space on each side (`<search> E1 </search>`,
`<answer> X </answer>`; the parser strips them): a byte-level BPE spells " E1" with the same
tokens as the question and the passages do, so writing a query or an answer is copying tokens
from the context, a skill that carries over to entities never seen as targets.

A configurable share is deliberately imperfect, so the SFT start leaves room for RL:
- `skipped_search`: stops searching k < hops hops early and answers with the entity the
  chain had reached (the bridge entity, or for k = 0 a random corpus title);
- `wrong_hop`: searches the whole chain but answers with an earlier hop's entity.

A further share (`baseline_fraction`) is in the two baseline formats of the rollout loop, so
that the no-search and retrieve-once baselines measure the policy and not a format it never
saw: the template opens `<answer>` right after the prompt (`no_search`), or after one
`<information>` block retrieved with the question itself (`retrieve_once`); the policy
writes only ` X </answer>` (the gold answer, whether or not the context holds it).

`world_demos` adds demonstrations from freshly generated synthetic worlds (other seeds, their
own searcher), so hundreds of distinct names must be copied rather than memorised.

Each demonstration is a list of (text, trainable) segments; the SFT loss covers only the
trainable (policy-written) ones, so prompt and inserted passages are never learnt as output.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tqdm import tqdm

from searchrl.config import SyntheticWorldConfig
from searchrl.datasets.synthetic import generate_world
from searchrl.retrieval.base import Searcher
from searchrl.types import Passage, QAExample, SearchHit

DemoKind = Literal["gold", "skipped_search", "wrong_hop", "no_search", "retrieve_once",
                   "corpus"]
PromptFn = Callable[[str], str]
InfoFn = Callable[[Sequence[SearchHit]], str]
SearcherFactory = Callable[[Sequence[Passage]], Searcher]


def default_information(hits: Sequence[SearchHit]) -> str:
    """Search-R1's `Doc i(Title: t) text` block; the trainer passes the rollout's formatter."""
    body = "\n".join(f"Doc {i}(Title: {h.title}) {h.contents}" for i, h in enumerate(hits, 1))
    return f"<information>{body}</information>"


@dataclass(frozen=True)
class Demo:
    example_id: str
    kind: DemoKind
    hops: int
    answer: str
    segments: tuple[tuple[str, bool], ...]  # (text, trainable)
    qtype: str = "unknown"  # the question's type (per-type tables, e.g. the copy benchmark)

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.segments)


@dataclass
class DemoStats:
    built: int = 0
    skipped_no_chain: int = 0  # no supporting docs / doc missing from the corpus
    skipped_gold_not_retrieved: int = 0  # the searcher did not return the chain's passage
    kinds: dict[str, int] = field(default_factory=dict)
    # Per question type: a type missing from `by_type` gets no SFT signal at all (issue 25).
    by_type: dict[str, int] = field(default_factory=dict)
    not_retrieved_by_type: dict[str, int] = field(default_factory=dict)


class DemoError(ValueError):
    """A training example's chain cannot be rendered (names the example and field)."""


def _chain_titles(ex: QAExample, passages: Mapping[str, Passage]) -> list[str] | None:
    titles: list[str] = []
    for doc_id in ex.supporting_doc_ids:
        passage = passages.get(doc_id)
        if passage is None or not passage.title:
            return None
        titles.append(passage.title)
    return titles or None


def chain_queries(ex: QAExample, passages: Mapping[str, Passage]) -> list[str] | None:
    """The gold query of each hop: the example's `search_queries` when it has them (an alias,
    a namesake's profession and name), else each supporting passage's title; None when the
    chain cannot be rendered."""
    titles = _chain_titles(ex, passages)
    if titles is None:
        return None
    if ex.search_queries:
        return list(ex.search_queries) if len(ex.search_queries) == len(titles) else None
    return titles


def build_demos(examples: Sequence[QAExample], passages: Mapping[str, Passage],
                searcher: Searcher, *, prompt_fn: PromptFn, info_fn: InfoFn = default_information,
                top_k: int = 1, imperfect_fraction: float = 0.2, n_demos: int | None = None,
                imperfect_kinds: Mapping[str, float] | None = None,
                seed: int = 0, eos: str = "", baseline_fraction: float = 0.0,
                answer_open: str = "<answer>") -> tuple[list[Demo], DemoStats]:
    """Demonstrations for (cycling through) `examples`, `n_demos` of them (default: one each).

    Examples without a usable chain (no supporting docs, a doc missing or untitled) or whose
    chain passage the searcher does not return are skipped and counted in the stats, never
    rendered with an answer the policy could not have read. A `baseline_fraction` share is in
    the no-search / retrieve-once formats (half each; `answer_open` is the template's
    opener), the rest agentic, of which `imperfect_fraction` is imperfect, of each kind in
    proportion to `imperfect_kinds` (default: skipped_search and wrong_hop alike). Deterministic
    given `seed`.
    """
    for name, value in (("imperfect_fraction", imperfect_fraction),
                        ("baseline_fraction", baseline_fraction)):
        if not 0.0 <= value <= 1.0:
            raise DemoError(f"{name} must be in [0, 1], got {value}")
    weights = dict(imperfect_kinds or {"skipped_search": 1.0, "wrong_hop": 1.0})
    if set(weights) - {"skipped_search", "wrong_hop"} or not sum(weights.values()) > 0 or any(
            w < 0 for w in weights.values()):
        raise DemoError("imperfect_kinds: weights >= 0 with a positive sum for skipped_search /"
                        f" wrong_hop, got {weights}")
    kinds, kind_weights = list(weights), list(weights.values())
    rng = random.Random(seed)
    stats = DemoStats()
    usable: list[tuple[QAExample, list[str]]] = []  # (example, its hops' queries)
    for ex in examples:
        titles = chain_queries(ex, passages)
        if titles is None:
            stats.skipped_no_chain += 1
        else:
            usable.append((ex, titles))
    if not usable:
        raise DemoError("no training example has supporting_doc_ids whose passages (with "
                        "titles) are in the corpus; demonstrations need the gold chain")
    # One search per distinct title, batched: the searcher is the slow part.
    distinct = sorted({t for _, titles in usable for t in titles})
    hits = dict(zip(distinct, searcher.search_batch(distinct, top_k), strict=True))
    question_hits: dict[str, list[SearchHit]] = {}
    if baseline_fraction > 0.0:
        questions = sorted({ex.question for ex, _ in usable})
        question_hits = dict(zip(questions, searcher.search_batch(questions, top_k),
                                 strict=True))
    all_titles = sorted({p.title for p in passages.values() if p.title})
    target = n_demos if n_demos is not None else len(usable)
    order = list(range(len(usable)))
    demos: list[Demo] = []
    cursor = 0
    attempts = 0
    while len(demos) < target and attempts < 4 * target + len(usable):
        attempts += 1
        if cursor % len(order) == 0:
            rng.shuffle(order)
        ex, titles = usable[order[cursor % len(order)]]
        cursor += 1
        qtype = ex.type or "unknown"
        if any(doc not in {h.doc_id for h in hits[q]}
               for q, doc in zip(titles, ex.supporting_doc_ids, strict=True)):
            stats.skipped_gold_not_retrieved += 1
            _count(stats.not_retrieved_by_type, qtype)
            continue
        _count(stats.by_type, qtype)
        kind: DemoKind = "gold"
        if baseline_fraction > 0.0 and rng.random() < baseline_fraction:
            kind = rng.choice(["no_search", "retrieve_once"])
            demo = _render_baseline(ex, kind, question_hits, prompt_fn, info_fn, answer_open,
                                    eos)
            demos.append(demo)
            stats.kinds[kind] = stats.kinds.get(kind, 0) + 1
            continue
        if rng.random() < imperfect_fraction:
            kind = rng.choices(kinds, kind_weights)[0]  # type: ignore[assignment]
        demo = _render(ex, titles, hits, kind, rng, prompt_fn, info_fn, all_titles, eos,
                       [passages[d].title or "" for d in ex.supporting_doc_ids])
        demos.append(demo)
        stats.kinds[kind] = stats.kinds.get(kind, 0) + 1
    stats.built = len(demos)
    return demos, stats


def _count(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


def corpus_documents(passages: Sequence[Passage], info_fn: InfoFn = default_information
                     ) -> list[Demo]:
    """Every passage as a context-only "demo" in the `<information>` layout rollouts insert:
    language-modelling text (no policy tokens), the stand-in for a base model having read
    its retrieval corpus (as real LLMs have read Wikipedia)."""
    return [Demo(example_id=f"corpus:{p.id}", kind="corpus", hops=0, answer="",
                 segments=((info_fn([SearchHit(doc_id=p.id, title=p.title or "",
                                                contents=p.contents, score=0.0)]), False),))
            for p in passages]


def _render(ex: QAExample, titles: list[str], hits: Mapping[str, list[SearchHit]],
            kind: DemoKind, rng: random.Random, prompt_fn: PromptFn, info_fn: InfoFn,
            all_titles: list[str], eos: str, doc_titles: list[str]) -> Demo:
    """`titles` are the hops' queries, `doc_titles` their passages' titles (the entities an
    imperfect demonstration answers with)."""
    n_search = len(titles)
    answer = ex.golden_answers[0]
    if kind == "skipped_search":
        n_search = rng.randrange(len(titles))  # 0 .. hops-1 searches
        answer = doc_titles[n_search] if n_search > 0 else rng.choice(all_titles)
    elif kind == "wrong_hop":
        # An entity the chain passed through instead of the final one.
        answer = rng.choice(doc_titles[1:]) if len(doc_titles) > 1 else doc_titles[0]
    while kind != "gold" and answer in ex.golden_answers:
        # The chain can pass through the answer itself (a capital is also a birth city).
        answer = rng.choice(all_titles)
    segments: list[tuple[str, bool]] = [(prompt_fn(ex.question), False)]
    for title in titles[:n_search]:
        segments.append((f"<think>search</think><search> {title} </search>", True))
        segments.append((info_fn(hits[title]), False))
    segments.append((f"<think>answer</think><answer> {answer} </answer>{eos}", True))
    return Demo(example_id=ex.id, kind=kind, hops=len(titles), answer=answer,
                segments=tuple(segments), qtype=ex.type or "unknown")


def _render_baseline(ex: QAExample, kind: DemoKind,
                     question_hits: Mapping[str, list[SearchHit]], prompt_fn: PromptFn,
                     info_fn: InfoFn, answer_open: str, eos: str) -> Demo:
    """The rollout's baseline glue: [information(question)] + template `<answer>` (mask 0)."""
    answer = ex.golden_answers[0]
    segments: list[tuple[str, bool]] = [(prompt_fn(ex.question), False)]
    if kind == "retrieve_once":
        segments.append((info_fn(question_hits[ex.question]), False))
    segments.append((answer_open, False))
    segments.append((f" {answer} </answer>{eos}", True))
    return Demo(example_id=ex.id, kind=kind, hops=ex.hops or 0, answer=answer,
                segments=tuple(segments), qtype=ex.type or "unknown")


def world_demos(world_cfg: SyntheticWorldConfig, seeds: Sequence[int],
                make_searcher: SearcherFactory, *, exclude_names: Collection[str] = (),
                n_demos: int, **demo_kwargs: Any) -> tuple[list[Demo], DemoStats]:
    """`n_demos` demonstrations from the train splits of synthetic worlds generated with
    `world_cfg` and each of `seeds` (spread evenly), each world searched by its own
    `make_searcher(passages)`.

    Questions touching an entity named in `exclude_names` (the real corpus's titles) are
    dropped, so no name of the evaluated world ever becomes an output target. Other keyword
    arguments go to `build_demos`; the stats are summed over worlds.
    """
    if not seeds or n_demos <= 0:
        return [], DemoStats()
    excluded = set(exclude_names)
    demos: list[Demo] = []
    total = DemoStats()
    # A bar: the demo's cold start builds thousands of demos over several worlds (seconds each).
    for i, seed in enumerate(tqdm(seeds, desc="cold-start demos", unit="world")):
        world = generate_world(world_cfg.model_copy(update={"seed": seed}))
        by_id = {p.id: p for p in world.passages}
        train = [ex for ex in world.splits["train"]
                 if not ({by_id[d].title for d in ex.supporting_doc_ids}
                         | set(ex.golden_answers)) & excluded]
        share = n_demos // len(seeds) + (1 if i < n_demos % len(seeds) else 0)
        built, stats = build_demos(train, by_id, make_searcher(world.passages),
                                   n_demos=share, seed=seed, **demo_kwargs)
        demos.extend(replace(d, example_id=f"w{seed}:{d.example_id}") for d in built)
        total.built += stats.built
        total.skipped_no_chain += stats.skipped_no_chain
        total.skipped_gold_not_retrieved += stats.skipped_gold_not_retrieved
        for mine, theirs in ((total.kinds, stats.kinds), (total.by_type, stats.by_type),
                             (total.not_retrieved_by_type, stats.not_retrieved_by_type)):
            for k, v in theirs.items():
                _count(mine, k, v)
    return demos, total
