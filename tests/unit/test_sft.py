"""Scripted demonstrations and the masked cold-start SFT."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch

from searchrl.config import IndexConfig, SFTConfig, SyntheticWorldConfig, TinyModelConfig
from searchrl.datasets.synthetic import SYNTHETIC_TYPES, generate_world
from searchrl.models.tiny import build_tiny_model, train_tokenizer
from searchrl.retrieval.bm25 import BM25Index
from searchrl.retrieval.index_store import LocalSearcher
from searchrl.rl.actions import Answer, Search, parse_action
from searchrl.train.cold_start.demos import (
    Demo,
    DemoError,
    build_demos,
    corpus_documents,
    world_demos,
)
from searchrl.train.cold_start.sft import (
    batch_loss_backward,
    collate_demos,
    context_targets,
    masked_nll,
    run_sft,
    tokenize_demo,
)
from searchrl.types import Passage, QAExample, SearchHit

WORLD = generate_world(SyntheticWorldConfig(profile="classic", seed=3, n_people=30, n_cities=8,
                                            n_countries=4, n_organisations=8, n_train=40,
                                            n_dev=4, n_test=4))
PASSAGES = {p.id: p for p in WORLD.passages}


class TitleSearcher:
    """Exact-title lookup standing in for BM25: returns the named passage then a distractor."""

    def __init__(self, passages: Sequence[Passage]) -> None:
        self.by_title = {p.title: p for p in passages}
        self.passages = list(passages)

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        out = []
        for q in queries:
            hits = [self.by_title[q]] if q in self.by_title else []
            hits += [p for p in self.passages if p.title != q][: top_k - len(hits)]
            out.append([SearchHit(p.id, p.title, p.contents, 1.0) for p in hits[:top_k]])
        return out


def prompt(q: str) -> str:
    return f"Question: {q}\n"


def test_gold_demo_follows_the_chain() -> None:
    train = WORLD.splits["train"]
    demos, stats = build_demos(train, PASSAGES, TitleSearcher(WORLD.passages), prompt_fn=prompt,
                               imperfect_fraction=0.0, seed=0)
    assert stats.built == len(train) and stats.kinds == {"gold": len(train)}
    for demo, ex in zip(sorted(demos, key=lambda d: d.example_id),
                        sorted(train, key=lambda e: e.id), strict=True):
        titles = [PASSAGES[d].title for d in ex.supporting_doc_ids]
        # Names sit between spaces inside the tags (the parser strips them).
        searches = [t.split("<search>")[1].split("</search>")[0].strip()
                    for t, trainable in demo.segments if "<search>" in t]
        assert searches == titles
        assert demo.answer == ex.golden_answers[0]
        assert demo.text.endswith(f"<answer> {ex.golden_answers[0]} </answer>")
        # Inserted passages are never trainable; policy segments never contain them.
        for text, trainable in demo.segments:
            assert trainable == ("<information>" not in text and not text.startswith("Question"))


def test_imperfect_demos_answer_wrong_and_share_is_configurable() -> None:
    train = WORLD.splits["train"]
    demos, stats = build_demos(train, PASSAGES, TitleSearcher(WORLD.passages), prompt_fn=prompt,
                               imperfect_fraction=1.0, n_demos=60, seed=1)
    assert stats.built == 60 and "gold" not in stats.kinds
    assert set(stats.kinds) == {"skipped_search", "wrong_hop"}
    gold = {e.id: e.golden_answers[0] for e in train}
    assert all(d.answer != gold[d.example_id] for d in demos)
    skipped = [d for d in demos if d.kind == "skipped_search"]
    assert all(d.text.count("<search>") < d.hops for d in skipped)
    half, _ = build_demos(train, PASSAGES, TitleSearcher(WORLD.passages), prompt_fn=prompt,
                          imperfect_fraction=0.5, n_demos=200, seed=2)
    share = sum(d.kind != "gold" for d in half) / len(half)
    assert 0.35 < share < 0.65


def test_imperfect_kinds_weights_pick_the_kind() -> None:
    train = WORLD.splits["train"]
    only_skips, stats = build_demos(train, PASSAGES, TitleSearcher(WORLD.passages),
                                    prompt_fn=prompt, imperfect_fraction=1.0, n_demos=40, seed=3,
                                    imperfect_kinds={"skipped_search": 1.0, "wrong_hop": 0.0})
    assert set(stats.kinds) == {"skipped_search"} and len(only_skips) == 40
    assert all(d.text.count("<search>") < d.hops for d in only_skips)
    with pytest.raises(DemoError, match="imperfect_kinds"):
        build_demos(train, PASSAGES, TitleSearcher(WORLD.passages), prompt_fn=prompt,
                    imperfect_kinds={"skipped_search": 0.0, "wrong_hop": 0.0})
    with pytest.raises(ValueError, match="imperfect_kinds"):
        SFTConfig(imperfect_kinds={"skipped_search": -1.0, "wrong_hop": 2.0})


def test_corpus_documents_are_context_only_in_the_rollout_layout() -> None:
    docs = corpus_documents(WORLD.passages)
    assert len(docs) == len(WORLD.passages)
    assert all(not trainable for d in docs for _, trainable in d.segments)
    first = WORLD.passages[0]
    assert docs[0].text.startswith("<information>") and first.contents in docs[0].text
    tok = train_tokenizer([p.contents for p in WORLD.passages], vocab_size=300)
    tokenized = tokenize_demo(docs[0], tok, max_len=1024)
    assert sum(tokenized.loss_mask) == 0  # language-modelling text, never a policy target


def test_examples_without_a_chain_are_skipped_and_counted() -> None:
    good = WORLD.splits["train"][0]
    bad = QAExample(id="x", question="Who?", golden_answers=("A",), supporting_doc_ids=("nope",))
    demos, stats = build_demos([good, bad], PASSAGES, TitleSearcher(WORLD.passages),
                               prompt_fn=prompt)
    assert stats.skipped_no_chain == 1 and [d.example_id for d in demos] == [good.id]
    with pytest.raises(DemoError, match="supporting_doc_ids"):
        build_demos([bad], PASSAGES, TitleSearcher(WORLD.passages), prompt_fn=prompt)


def test_real_bm25_at_top_1_gives_demos_of_every_question_type() -> None:
    """The tiny config searches with BM25 and keeps one hit: every question type of the
    world must survive the "gold passage retrieved" filter, or RL starts with no signal on
    it (issue 25: all five organisation types had 0 demos, their twins outranked them)."""
    cfg = SyntheticWorldConfig(seed=3, n_people=80, n_cities=20, n_countries=6,
                               n_organisations=20, n_train=300, n_dev=4, n_test=4)

    def bm25(passages: Sequence[Passage]) -> LocalSearcher:
        index = BM25Index.build([p.contents for p in passages])
        return LocalSearcher(passages, IndexConfig(retriever="bm25"), bm25=index)

    demos, stats = world_demos(cfg, [101, 202], bm25, n_demos=400, prompt_fn=prompt, top_k=1)
    types = {ex.type for seed in (101, 202)
             for ex in generate_world(cfg.model_copy(update={"seed": seed})).splits["train"]}
    assert {t for t in SYNTHETIC_TYPES if t.startswith("org_")} <= types
    assert set(stats.by_type) == types, f"no demos for {types - set(stats.by_type)}"
    assert stats.skipped_gold_not_retrieved == 0, stats.not_retrieved_by_type
    assert sum(stats.by_type.values()) == stats.built == len(demos) == 400


def _tiny(demos_text: list[str]):  # type: ignore[no-untyped-def]
    texts = [p.contents for p in WORLD.passages] + demos_text
    tok = train_tokenizer(texts, vocab_size=400)
    model = build_tiny_model(TinyModelConfig(vocab_size=400, n_layer=1, n_embd=32, n_head=2,
                                             n_positions=512), tok, seed=0)
    return model, tok


def test_tokenized_mask_covers_policy_tokens_only() -> None:
    demos, _ = build_demos(WORLD.splits["train"][:5], PASSAGES, TitleSearcher(WORLD.passages),
                           prompt_fn=prompt, imperfect_fraction=0.0)
    _, tok = _tiny([d.text for d in demos])
    for demo in demos:
        td = tokenize_demo(demo, tok, max_len=1024)
        assert len(td.input_ids) == len(td.loss_mask)
        policy = tok.decode([t for t, m in zip(td.input_ids, td.loss_mask, strict=True) if m])
        other = tok.decode([t for t, m in zip(td.input_ids, td.loss_mask, strict=True) if not m])
        assert "<answer>" in policy and "<information>" not in policy
        assert "<information>" in other and "<answer>" not in other
    with pytest.raises(ValueError, match="max_len"):
        tokenize_demo(demos[0], tok, max_len=5)


def _one_demo_batch(demo: Demo, tok: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ids, attention mask and policy-target mask ([1, L-1]) of one demo, for masked_nll."""
    td = tokenize_demo(demo, tok, max_len=1024)
    ids = torch.tensor([td.input_ids])
    return ids, torch.ones_like(ids), torch.tensor([td.loss_mask[1:]], dtype=torch.float32)


def test_sft_lowers_the_masked_loss() -> None:
    demos, _ = build_demos(WORLD.splits["train"], PASSAGES, TitleSearcher(WORLD.passages),
                           prompt_fn=prompt, imperfect_fraction=0.0, n_demos=48, seed=0)
    model, tok = _tiny([d.text for d in demos])
    ids, attn, tmask = _one_demo_batch(demos[0], tok)
    before = float(masked_nll(model, ids, attn, tmask).detach())
    result = run_sft(model, tok, demos, SFTConfig(epochs=4, lr=3e-3, batch_size=8), seed=0)
    after = float(masked_nll(model, ids, attn, tmask).detach())
    assert result.steps == 4 * 6
    assert after < before - 1.0
    assert sum(result.losses[-3:]) < sum(result.losses[:3])


@pytest.mark.parametrize("context_weight", [0.0, 0.5])
def test_micro_batches_accumulate_the_whole_batch_gradient(context_weight: float) -> None:
    """Length-sorted micro-batches (each padded only to its own longest) give the gradient
    and loss of the one padded batch: every micro-batch divides by the batch's token counts."""
    demos, _ = build_demos(WORLD.splits["train"], PASSAGES, TitleSearcher(WORLD.passages),
                           prompt_fn=prompt, imperfect_fraction=0.5, n_demos=10, seed=0)
    model, tok = _tiny([d.text for d in demos])
    items = [tokenize_demo(d, tok, max_len=1024) for d in demos]
    assert len({len(d.input_ids) for d in items}) > 3  # lengths differ: padding to save
    skip = [int(i) for i in tok.all_special_ids]
    pad = int(tok.pad_token_id)

    def grads(micro: int | None) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        cfg = SFTConfig(batch_size=10, micro_batch_size=micro, context_loss_weight=context_weight)
        loss = batch_loss_backward(model, items, pad, cfg, skip)
        return loss, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    whole_loss, whole = grads(10)
    one_pass = grads(None)[1]  # None: one pass, the batch's own order: the same numbers
    assert all(torch.equal(a, b) for a, b in zip(one_pass, whole, strict=True))
    ids, attn, tmask = collate_demos(items, pad)  # the unsorted padded batch, one pass
    plain = masked_nll(model, ids, attn, tmask, context_weight,
                       context_targets(ids, attn, tmask, skip) if context_weight else None)
    assert whole_loss == pytest.approx(float(plain.detach()), rel=1e-5)
    for micro in (1, 3, 4):
        loss, split = grads(micro)
        assert loss == pytest.approx(whole_loss, rel=1e-5)
        for a, b in zip(split, whole, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_baseline_format_demos_use_the_rollout_glue() -> None:
    train = WORLD.splits["train"]
    searcher = TitleSearcher(WORLD.passages)
    demos, stats = build_demos(train, PASSAGES, searcher, prompt_fn=prompt,
                               imperfect_fraction=0.0, baseline_fraction=1.0, n_demos=40,
                               seed=4, answer_open="<answer>")
    assert set(stats.kinds) == {"no_search", "retrieve_once"} and stats.built == 40
    gold = {e.id: e for e in train}
    for demo in demos:
        ex = gold[demo.example_id]
        *context, (policy, trainable) = demo.segments
        assert trainable and all(not t for _, t in context)
        # The template opened the answer; the policy only continues it.
        assert context[-1] == ("<answer>", False)
        assert parse_action("<answer>" + policy) == Answer(ex.golden_answers[0])
        assert "<search>" not in demo.text
        infos = [t for t, _ in context if "<information>" in t]
        if demo.kind == "retrieve_once":
            (hit,) = searcher.search_batch([ex.question], 1)[0]
            assert len(infos) == 1 and hit.contents in infos[0]
        else:
            assert infos == []


def test_world_demos_come_from_other_worlds_and_skip_excluded_names() -> None:
    cfg = SyntheticWorldConfig(seed=3, n_people=30, n_cities=8, n_countries=4,
                               n_organisations=8, n_train=40, n_dev=4, n_test=4)
    main_titles = {p.title for p in WORLD.passages}
    demos, stats = world_demos(cfg, [101, 202], TitleSearcher, exclude_names=main_titles,
                               n_demos=30, prompt_fn=prompt, imperfect_fraction=0.0)
    assert stats.built == len(demos) == 30
    assert {d.example_id.split(":")[0] for d in demos} == {"w101", "w202"}
    for demo in demos:
        queries = [a.query for t, ok in demo.segments if ok
                   for a in [parse_action(t)] if isinstance(a, Search)]
        assert queries and not set(queries) & main_titles and demo.answer not in main_titles
    # Excluding every name of a world leaves nothing to demonstrate from it.
    other = generate_world(cfg.model_copy(update={"seed": 101}))
    with pytest.raises(DemoError):
        world_demos(cfg, [101], TitleSearcher,
                    exclude_names={p.title for p in other.passages}, n_demos=5,
                    prompt_fn=prompt)


def test_context_loss_adds_the_weighted_context_nll() -> None:
    demos, _ = build_demos(WORLD.splits["train"][:3], PASSAGES, TitleSearcher(WORLD.passages),
                           prompt_fn=prompt, imperfect_fraction=0.0)
    model, tok = _tiny([d.text for d in demos])
    ids, attn, tmask = _one_demo_batch(demos[0], tok)
    policy_only = float(masked_nll(model, ids, attn, tmask).detach())
    context_only = float(masked_nll(model, ids, attn, torch.zeros_like(tmask), 1.0).detach())
    both = float(masked_nll(model, ids, attn, tmask, 0.5).detach())
    # With an all-zero policy mask every real target is context.
    assert context_only > 0 and policy_only > 0
    context_nll = float(masked_nll(model, ids, attn, 1.0 - tmask).detach())
    assert both == pytest.approx(policy_only + 0.5 * context_nll, rel=1e-5)


def test_context_targets_never_teach_the_policy_to_write_tags() -> None:
    demos, _ = build_demos(WORLD.splits["train"][:3], PASSAGES, TitleSearcher(WORLD.passages),
                           prompt_fn=prompt, imperfect_fraction=0.0)
    _, tok = _tiny([d.text for d in demos])
    td = tokenize_demo(demos[0], tok, max_len=1024)
    ids = torch.tensor([td.input_ids + [int(tok.pad_token_id)] * 3])
    attn = torch.tensor([[1] * len(td.input_ids) + [0] * 3])
    tmask = torch.tensor([td.loss_mask[1:] + [0] * 3], dtype=torch.float32)
    info = tok.convert_tokens_to_ids("<information>")
    cmask = context_targets(ids, attn, tmask, tok.all_special_ids)
    targets = ids[0, 1:]
    assert bool((targets == info).any())  # the demo inserts an information block
    assert not bool(cmask[0][targets == info].any())  # ... whose tag is never a target
    assert not bool((cmask * tmask).any()) and not bool(cmask[0, -3:].any())
    # The passage text itself is learnt as context.
    assert float(cmask.sum()) > float(tmask.sum())
