"""HF generation backends: the KV-cache path must match the plain full-context path exactly."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from searchrl.config import PipelineConfig, RewardConfig, RolloutConfig, TinyModelConfig
from searchrl.generation import hf
from searchrl.generation.base import SamplingParams, StopChecker, sample_next
from searchrl.generation.hf import HFFullContextGenerator, HFGenerator
from searchrl.models.tiny import build_tiny_model
from searchrl.rl.rollout import run_rollouts
from searchrl.types import QAExample, SearchHit
from tests.tagged_policy import WORDS, demo_tokenizer, searching_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    return demo_tokenizer()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def random_model(tok, request):  # type: ignore[no-untyped-def]
    # qwen2: the real configs' architecture, randomly initialised (the GPU smoke model)
    return build_tiny_model(TinyModelConfig(architecture=request.param, n_layer=2, n_embd=64,
                                            n_head=4), tok, seed=1)


@pytest.fixture(scope="module")
def tagged_model(tok):  # type: ignore[no-untyped-def]
    """A tiny model briefly trained on tag-structured demos, so greedy rollouts search."""
    return searching_model(tok)


def _contexts(tok, texts):  # type: ignore[no-untyped-def]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_kv_cache_path_matches_full_context_over_turns(tok, random_model) -> None:  # type: ignore[no-untyped-def]
    fast, plain = HFGenerator(random_model, tok), HFFullContextGenerator(random_model, tok)
    params = SamplingParams(max_new_tokens=9, greedy=True)
    ctx = _contexts(tok, ["what about w1?", "w2 w3 w4 w5 w6 w7", "w9", "Question: w10 w11"])
    keys = ["a", "b", "c", "d"]
    limits = [9, 4, 9, 2]
    a = fast.generate(ctx, params, keys=keys, limits=limits)
    b = plain.generate(ctx, params, limits=limits)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert [len(o.token_ids) for o in a] == limits
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    # Next turn: rows drop out, change order, and get different-length insertions.
    info = _contexts(tok, [" w40 w41 w42", " w43", " w44 w45 w46 w47 w48 w49"])
    order = [3, 0, 2]
    ctx2 = [ctx[r] + a[r].token_ids + info[j] for j, r in enumerate(order)]
    prefill_before = fast.prefill_tokens
    a2 = fast.generate(ctx2, params, keys=[keys[r] for r in order])
    b2 = plain.generate(ctx2, params)
    assert [o.token_ids for o in a2] == [o.token_ids for o in b2]
    # Only the last sampled token + the insertion was prefilled, not the whole context.
    assert fast.prefill_tokens - prefill_before == sum(1 + len(i) for i in info)


def test_changed_context_rebuilds_the_cache(tok, random_model) -> None:  # type: ignore[no-untyped-def]
    fast, plain = HFGenerator(random_model, tok), HFFullContextGenerator(random_model, tok)
    params = SamplingParams(max_new_tokens=5, greedy=True)
    ctx = _contexts(tok, ["w1 w2", "w3"])
    fast.generate(ctx, params, keys=["x", "y"])
    edited = _contexts(tok, ["w7 w2 w5", "w3 w3"])  # not an extension of what was cached
    assert ([o.token_ids for o in fast.generate(edited, params, keys=["x", "y"])]
            == [o.token_ids for o in plain.generate(edited, params)])


def test_sampling_is_seeded_and_logprobs_match_a_forward_pass(tok, random_model) -> None:  # type: ignore[no-untyped-def]
    gen = HFGenerator(random_model, tok)
    params = SamplingParams(max_new_tokens=8, temperature=0.7, top_p=0.9)
    ctx = _contexts(tok, ["w1 w2", "w3 w4 w5"])
    first = gen.generate(ctx, params, seed=5)
    again = gen.generate(ctx, params, seed=5)
    other = gen.generate(ctx, params, seed=6)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert [o.token_ids for o in first] != [o.token_ids for o in other]
    for c, out in zip(ctx, first, strict=True):
        ids = torch.tensor([c + out.token_ids])
        with torch.no_grad():
            logits = random_model(input_ids=ids).logits[0].float() / 0.7
        logp = torch.log_softmax(logits, dim=-1)
        expected = [logp[len(c) - 1 + j, t].item() for j, t in enumerate(out.token_ids)]
        assert out.logprobs == pytest.approx(expected, abs=1e-4)


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.05, 0.05]]))
    rng = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=1, top_p=0.8)
    drawn = {int(sample_next(logits, params, rng)[0]) for _ in range(200)}
    assert drawn == {0, 1}


def test_stop_string_split_over_tokens_is_detected(tok) -> None:  # type: ignore[no-untyped-def]
    checker = StopChecker(tok, ("</search>",))
    pieces = [tok.convert_tokens_to_ids(c) for c in ["<", "/", "s", "e", "a", "r", "c", "h"]]
    assert not checker.hit(pieces)
    assert checker.hit([*pieces, tok.convert_tokens_to_ids(">")])
    assert checker.hit([tok.convert_tokens_to_ids("</search>")])


@pytest.mark.parametrize("stops", [("</search>", "</answer>"), ("ch>", "a")])
def test_stop_checks_agree_with_decoding_every_tail(tok, stops) -> None:  # type: ignore[no-untyped-def]
    """The fast path never changes where a row stops: on random token streams rich in tag
    pieces, the first hit is where decoding the whole tail after every token finds one."""
    checker = StopChecker(tok, stops)
    pieces = [tok.convert_tokens_to_ids(t) for t in ["<", "/", "s", "e", "a", "r", "c", "h", ">",
                                                     "n", "w", "</search>", "</answer>"]]
    vocab = list(range(len(tok)))
    rng = torch.Generator().manual_seed(0)
    stopped = 0
    for _ in range(400):
        draw = torch.randint(0, 2, (60,), generator=rng).tolist()
        picks = torch.randint(0, 10**6, (60,), generator=rng).tolist()
        row = [pieces[p % len(pieces)] if d else vocab[p % len(vocab)]
               for d, p in zip(draw, picks, strict=True)]
        fast = next((i for i in range(1, 61) if checker.hit(row[:i])), None)
        full = next((i for i in range(1, 61)
                     if any(s in tok.decode(row[:i][-len(max(stops, key=len)):],
                                            skip_special_tokens=False) for s in stops)), None)
        assert fast == full, tok.convert_ids_to_tokens(row)
        stopped += fast is not None
    assert stopped > 100  # the streams do stop, often


def test_stop_strings_must_be_ascii(tok) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="ASCII"):
        StopChecker(tok, ("</réponse>",))


class _DictSearcher:
    def search_batch(self, queries, top_k):  # type: ignore[no-untyped-def]
        return [[SearchHit(f"d-{q}", None, f"{q} is w{len(q) % 50}", 1.0)] for q in queries]


def test_greedy_rollouts_identical_with_and_without_kv_cache(tok, tagged_model) -> None:  # type: ignore[no-untyped-def]
    examples = [QAExample(id=f"q{i}", question=f"what about {WORDS[i]}?",
                          golden_answers=(WORDS[i + 1],)) for i in range(3)]
    cfg = RolloutConfig(max_turns=2, max_new_tokens_per_turn=14, max_response_tokens=120,
                        top_k=1, max_batch_rows=4)
    fast = run_rollouts(examples, HFGenerator(tagged_model, tok), _DictSearcher(), cfg,
                        RewardConfig(), group_size=2, greedy=True)
    plain = run_rollouts(examples, HFFullContextGenerator(tagged_model, tok), _DictSearcher(),
                         cfg, RewardConfig(), group_size=2, greedy=True)
    assert [r.response_ids for r in fast.records] == [r.response_ids for r in plain.records]
    assert [r.loss_mask for r in fast.records] == [r.loss_mask for r in plain.records]
    # The trained model really searches, so this compared multi-turn rollouts.
    assert fast.stats["searches_per_rollout"] >= 1.0
    assert max(r.turns for r in fast.records) >= 2


def test_growing_kv_buffers_give_the_same_numbers_as_concatenation(  # type: ignore[no-untyped-def]
        tok, tagged_model, monkeypatch) -> None:
    """The KV buffers with spare room (no copy of the whole cache per token) sample exactly
    the tokens and log-probs transformers' concatenating DynamicCache gives, over turns with
    rows leaving the batch (reorder, dropped slots) and shared prompts fanned out."""
    examples = [QAExample(id=f"q{i}", question=f"what about {WORDS[i]}?",
                          golden_answers=(WORDS[i + 1],)) for i in range(4)]
    cfg = RolloutConfig(max_turns=3, max_new_tokens_per_turn=14, max_response_tokens=160,
                        top_k=1, max_batch_rows=16, temperature=1.3)

    def rollouts() -> list[tuple[list[int], list[float]]]:
        batch = run_rollouts(examples, HFGenerator(tagged_model, tok), _DictSearcher(), cfg,
                             RewardConfig(), group_size=4, seed=11)
        return [(r.response_ids, r.old_logprobs) for r in batch.records]

    grown = rollouts()
    monkeypatch.setattr(hf, "_growing_cache",
                        lambda config, headroom: hf.DynamicCache(config=config))
    assert rollouts() == grown
    assert len({len(ids) for ids, _ in grown}) > 1  # rows of different lengths, turns


def test_narrowing_the_batch_to_rows_still_decoding_changes_no_sample(  # type: ignore[no-untyped-def]
        tok, tagged_model, monkeypatch) -> None:
    """Rows that stopped leave the forward batch (once half of it has stopped): the sampled
    tokens are those of a batch that keeps feeding them pads, and log-probs agree to float
    rounding (a smaller batch may round differently)."""
    examples = [QAExample(id=f"q{i}", question=f"what about {WORDS[i]}?",
                          golden_answers=(WORDS[i + 1],)) for i in range(4)]
    cfg = RolloutConfig(max_turns=3, max_new_tokens_per_turn=14, max_response_tokens=160,
                        top_k=1, max_batch_rows=16, temperature=1.3)
    decode_rows: list[int] = []  # rows of every decoding pass
    forward = HFGenerator._forward

    def spy(self, state, chunk, mask, positions):  # type: ignore[no-untyped-def]
        if chunk.shape[1] == 1:
            decode_rows.append(int(chunk.shape[0]))
        return forward(self, state, chunk, mask, positions)

    monkeypatch.setattr(HFGenerator, "_forward", spy)

    def rollouts() -> tuple[list[tuple[list[int], list[float]]], list[int]]:
        decode_rows.clear()
        batch = run_rollouts(examples, HFGenerator(tagged_model, tok), _DictSearcher(), cfg,
                             RewardConfig(), group_size=4, seed=11)
        return [(r.response_ids, r.old_logprobs) for r in batch.records], list(decode_rows)

    narrowed, narrowed_rows = rollouts()
    monkeypatch.setattr(hf, "_NARROW_AT", 0.0)
    full, full_rows = rollouts()
    # As many passes, but fewer rows computed: stopped rows left the batch.
    assert len(narrowed_rows) == len(full_rows)
    assert sum(narrowed_rows) < sum(full_rows)
    assert any(a <= b // 2 for a, b in zip(narrowed_rows, full_rows, strict=True))
    assert [ids for ids, _ in narrowed] == [ids for ids, _ in full]
    for (_, a), (_, b) in zip(narrowed, full, strict=True):
        assert a == pytest.approx(b, abs=1e-5)


def test_vllm_backend_without_vllm_fails_with_the_fix(tok, random_model) -> None:  # type: ignore[no-untyped-def]
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm installed: covered by tests/unit/test_generation_vllm.py")
    from searchrl.generation.factory import make_generator
    from searchrl.generation.vllm import VLLMGenerator

    with pytest.raises(ImportError, match=r"searchrl\[gpu\]"):
        VLLMGenerator("some/dir", tok)
    vllm_config = PipelineConfig().model_copy(
        update={"rollout": RolloutConfig(backend="vllm")})
    with pytest.raises(ValueError, match="policy_dir"):
        make_generator(vllm_config, model=random_model, tokenizer=tok)
    with pytest.raises(ImportError, match=r"searchrl\[gpu\]"):
        make_generator(vllm_config, policy_dir="some/dir", tokenizer=tok)
    assert isinstance(make_generator(PipelineConfig(), model=random_model, tokenizer=tok),
                      HFGenerator)


def test_shared_prompts_are_prefilled_once(tok, random_model) -> None:  # type: ignore[no-untyped-def]
    fast, plain = HFGenerator(random_model, tok), HFFullContextGenerator(random_model, tok)
    a, b = _contexts(tok, ["what about w1?", "w2 w3"])
    shared = hf._common_prefix_len([a, b])
    params = SamplingParams(max_new_tokens=6, greedy=True)
    out = fast.generate([a, a, b, a], params, keys=["0", "1", "2", "3"])
    # The prefix both prompts start with once, then each distinct prompt's rest once.
    assert fast.prefill_tokens == shared + (len(a) - shared) + (len(b) - shared)
    assert [o.token_ids for o in out] == [o.token_ids for o in plain.generate([a, a, b, a],
                                                                               params)]
    # Rows that share a prompt still sample independently.
    sampled = fast.generate([a] * 4, SamplingParams(max_new_tokens=8), seed=3)
    assert len({tuple(o.token_ids) for o in sampled}) > 1


def test_common_prefix_len_matches_a_column_by_column_scan() -> None:
    rng = torch.Generator().manual_seed(0)

    def draw(n: int, high: int = 3) -> list[int]:
        return torch.randint(0, high, (n,), generator=rng).tolist()

    for _ in range(2000):
        base = draw(int(torch.randint(0, 7, (1,), generator=rng)))
        rows = [base[:int(torch.randint(0, len(base) + 1, (1,), generator=rng))]
                + draw(int(torch.randint(0, 3, (1,), generator=rng)))
                for _ in range(int(torch.randint(1, 5, (1,), generator=rng)))]
        shortest = min(len(r) for r in rows)
        scan = next((j for j in range(shortest) if len({r[j] for r in rows}) > 1), shortest)
        assert hf._common_prefix_len(rows) == scan, rows


def test_a_shared_prompt_template_is_prefilled_once(tok, random_model) -> None:  # type: ignore[no-untyped-def]
    """Prompts built from one template share most of their tokens: that prefix is prefilled
    once and fanned out, and each row attends to the same tokens at the same positions as a
    full-context pass (left padding of the rests leaves masked holes after the prefix)."""
    from searchrl.rl.prompts import build_prompt

    questions = ["what about w1?", "w2 w3 w4 w5 w6 w7 w8", "w9", "Question: w10 w11"]
    ctx = _contexts(tok, [build_prompt(q) for q in questions])
    shared = hf._common_prefix_len(ctx)
    assert shared >= 20  # the template
    fast, plain = HFGenerator(random_model, tok), HFFullContextGenerator(random_model, tok)
    params = SamplingParams(max_new_tokens=7, greedy=True)
    out = fast.generate(ctx, params, keys=["a", "b", "c", "d"])
    assert fast.prefill_tokens == shared + sum(len(c) - shared for c in ctx)
    expected = plain.generate(ctx, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in expected]
    for x, y in zip(out, expected, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    # The next turn extends the fanned-out cache.
    more = _contexts(tok, [" w40 w41", " w42", " w43 w44 w45", " w46"])
    ctx2 = [c + o.token_ids + m for c, o, m in zip(ctx, out, more, strict=True)]
    assert ([o.token_ids for o in fast.generate(ctx2, params, keys=["a", "b", "c", "d"])]
            == [o.token_ids for o in plain.generate(ctx2, params)])


def test_the_factory_loads_a_saved_policy_in_the_configured_dtype(  # type: ignore[no-untyped-def]
        tok, random_model, tmp_path) -> None:
    from searchrl.generation.factory import make_generator
    from searchrl.train.cold_start.sft import save_policy

    save_policy(random_model, tok, tmp_path / "policy")
    config = PipelineConfig().model_copy(update={"model": PipelineConfig().model.model_copy(
        update={"dtype": "bfloat16"})})
    generator = make_generator(config, policy_dir=tmp_path / "policy")
    assert isinstance(generator, HFGenerator)
    params = list(generator.model.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert {p.device.type for p in params} == {"cpu"} and not generator.model.training
