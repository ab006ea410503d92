"""The embedded pretrained prior (MiniLM warm-started as a causal LM, src/searchrl/models/
prior.py): its weights are the package's, it is causal, its KV-cached generation equals
uncached generation, it saves, loads and registers as any pretrained model, and the same GRPO
step function trains it and a Qwen-architecture model through `model.kind: pretrained`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from searchrl.config import PipelineConfig, TinyModelConfig
from searchrl.datasets.synthetic import generate_world
from searchrl.generation.base import SamplingParams
from searchrl.generation.hf import HFFullContextGenerator, HFGenerator
from searchrl.models.prior import (
    BUNDLED_PRIOR,
    PRIOR_CONFIG_KEY,
    prepare_prior,
    prior_fingerprint,
)
from searchrl.models.tiny import TAG_TOKENS, build_tiny_model, init_policy, load_policy
from searchrl.retrieval.dense import resolve_encoder_path
from searchrl.rl.prompts import build_prompt
from searchrl.rl.rollout import run_rollouts
from searchrl.tracking import download_registered_policy, register_policy, start_parent_run
from searchrl.train.cold_start.build import demo_kwargs
from searchrl.train.cold_start.demos import build_demos
from searchrl.train.cold_start.sft import save_policy, tokenize_demo
from searchrl.train.grpo.trainer import train_grpo
from searchrl.types import Passage, SearchHit
from tests.helpers import fresh_mlflow_uri
from tests.train_fixture import fake_rollouts, tiny_config, train_examples

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _world_texts() -> list[str]:
    world = generate_world(tiny_config(Path("/tmp")).data.synthetic)
    return [p.contents for p in world.passages] + [
        build_prompt(q.question) + " <answer> " + q.golden_answers[0]
        for q in world.splits["train"]]


@pytest.fixture(scope="module")
def prior_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare_prior(_world_texts(), TAG_TOKENS, tmp_path_factory.mktemp("p") / "prior")


def test_the_warm_start_keeps_the_packages_weights_bit_for_bit(prior_dir: Path) -> None:
    source = resolve_encoder_path(BUNDLED_PRIOR)
    assert source is not None
    package = load_file(str(source / "model.safetensors"))
    model, tok = load_policy(prior_dir)
    state = model.state_dict()
    for name in ("encoder.layer.3.attention.self.query.weight",
                 "encoder.layer.5.output.dense.weight", "embeddings.position_embeddings.weight"):
        assert torch.equal(state[f"bert.{name}"], package[name]), name
    # A kept word's embedding row is the package's row for that word.
    full = AutoTokenizer.from_pretrained(str(source))
    ours = state["bert.embeddings.word_embeddings.weight"][tok.convert_tokens_to_ids("born")]
    theirs = package["embeddings.word_embeddings.weight"][full.convert_tokens_to_ids("born")]
    assert torch.equal(ours, theirs)
    # The output layer is the (tied) word embedding matrix.
    assert model.get_output_embeddings().weight.data_ptr() == \
        model.get_input_embeddings().weight.data_ptr()


def test_the_trim_keeps_tokenisation_and_is_recorded(prior_dir: Path) -> None:
    source = resolve_encoder_path(BUNDLED_PRIOR)
    full = AutoTokenizer.from_pretrained(str(source))
    _, tok = load_policy(prior_dir)
    untagged = [t.replace("<", " ").replace(">", " ") for t in _world_texts()]
    for text in untagged:
        assert (tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])
                == full.tokenize(text)), text
    for tag in TAG_TOKENS:  # one special token each, never split
        assert tok(tag, add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(tag)]
    ids = tok("where was it founded?")["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.eos_token_id not in ids  # no [SEP] at the end
    record = getattr(load_policy(prior_dir)[0].config, PRIOR_CONFIG_KEY)
    assert record["source_sha256"] == prior_fingerprint()
    assert record["vocab_size"] == len(tok) < 3000 < record["source_vocab_size"] == 30522
    assert record["parameters"] < 0.6 * record["parameters_untrimmed"]
    # A word no text used is spelled in pieces, not lost to [UNK].
    assert tok.unk_token_id not in tok("zyxwvq quokka", add_special_tokens=False)["input_ids"]


def test_the_model_is_causal(prior_dir: Path) -> None:
    model, tok = load_policy(prior_dir)
    ids = torch.tensor([tok("the capital of the country is")["input_ids"]])
    changed = ids.clone()
    changed[0, -1] = tok.convert_tokens_to_ids("<answer>")
    with torch.no_grad():
        a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert torch.equal(a[0, :-1], b[0, :-1])  # a later token never changes an earlier logit
    assert not torch.equal(a[0, -1], b[0, -1])


def test_kv_cached_generation_equals_uncached_over_turns(prior_dir: Path) -> None:
    model, tok = load_policy(prior_dir)
    fast, plain = HFGenerator(model, tok), HFFullContextGenerator(model, tok)
    params = SamplingParams(max_new_tokens=8, greedy=True)
    ctx = [tok(t)["input_ids"] for t in ["where was the founder born?", "the city",
                                         "answer the question. question: who", "x"]]
    a = fast.generate(ctx, params, keys=list("abcd"), limits=[8, 3, 8, 2])
    b = plain.generate(ctx, params, limits=[8, 3, 8, 2])
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b, strict=True):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
    info = [tok(t, add_special_tokens=False)["input_ids"]
            for t in ["<information> the city of x </information>", " born", " the"]]
    order = [3, 0, 2]
    ctx2 = [ctx[r] + a[r].token_ids + info[j] for j, r in enumerate(order)]
    before = fast.prefill_tokens
    a2 = fast.generate(ctx2, params, keys=["d", "a", "c"])
    assert [o.token_ids for o in a2] == [o.token_ids for o in plain.generate(ctx2, params)]
    assert fast.prefill_tokens - before == sum(1 + len(i) for i in info)  # cache reused


def test_the_pretrained_path_prepares_the_bundled_prior(prior_dir: Path) -> None:
    cfg = PipelineConfig.model_validate({"model": {"kind": "pretrained",
                                                   "name_or_path": BUNDLED_PRIOR}})
    model, _ = init_policy(cfg.model, _world_texts(), seed=0)
    reference, _ = load_policy(prior_dir)
    assert type(model).__name__ == "BertLMHeadModel"
    for (name, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name  # same texts, same seed: the same prepared model


def _qwen_policy(out: Path) -> Path:
    from searchrl.models.tiny import train_tokenizer

    world = generate_world(tiny_config(Path("/tmp")).data.synthetic)
    tok = train_tokenizer([p.contents for p in world.passages], vocab_size=300)
    model = build_tiny_model(TinyModelConfig(architecture="qwen2", vocab_size=300, n_layer=1,
                                             n_embd=32, n_head=2, n_positions=512), tok)
    save_policy(model, tok, out)
    return out


def test_save_register_and_download_round_trip(tmp_path: Path, prior_dir: Path) -> None:
    uri = fresh_mlflow_uri(tmp_path)
    run = start_parent_run(uri, "exp", "gate", {})
    assert register_policy(uri, run.run_id, prior_dir, "prior-x", "champion") == "1"
    got = download_registered_policy(uri, "prior-x", "champion", tmp_path / "dl")
    assert got is not None
    ours, theirs = load_file(prior_dir / "model.safetensors"), load_file(got / "model.safetensors")
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    (a, tok_a), (b, tok_b) = load_policy(prior_dir), load_policy(got)
    ctx = [tok_a("where was the founder born?")["input_ids"]]
    params = SamplingParams(max_new_tokens=6, greedy=True)
    assert tok_a.get_vocab() == tok_b.get_vocab()
    assert ([o.token_ids for o in HFGenerator(a, tok_a).generate(ctx, params)]
            == [o.token_ids for o in HFGenerator(b, tok_b).generate(ctx, params)])
    assert getattr(b.config, PRIOR_CONFIG_KEY) == getattr(a.config, PRIOR_CONFIG_KEY)


@pytest.mark.smoke
@pytest.mark.parametrize("start", ["minilm_prior", "qwen2"])
def test_one_grpo_step_function_trains_the_prior_and_a_qwen_model(
        tmp_path: Path, prior_dir: Path, start: str) -> None:
    """Both are `model.kind: pretrained` starts handed to the same trainer (DeepSpeed engine,
    GRPO loss, masking); it has no branch for either."""
    base = prior_dir if start == "minilm_prior" else _qwen_policy(tmp_path / "qwen")
    cfg = tiny_config(tmp_path, steps=2, checkpoint_every=0, lr=1e-3)
    cfg = PipelineConfig.model_validate(cfg.model_dump() | {
        "model": {"kind": "pretrained", "name_or_path": str(base)}})
    result = train_grpo(cfg, train_examples(), None, base, tmp_path / "out",  # type: ignore[arg-type]
                        rollout_fn=fake_rollouts, progress=False)
    assert result.steps_done == 2 and all(torch.isfinite(torch.tensor(result.losses)))
    trained, _ = load_policy(result.policy_dir)
    start_model, _ = load_policy(base)
    moved = [n for n, p in trained.state_dict().items()
             if not torch.equal(p, start_model.state_dict()[n])]
    assert moved, "the GRPO step changed no weight"
    assert type(trained).__name__ == type(start_model).__name__



def test_a_new_release_of_the_package_changes_the_stages_that_prepare_the_prior(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from searchrl import stages
    from searchrl.config import load_config

    prior, tiny = load_config("configs/prior.yaml"), load_config("configs/tiny.yaml")
    inputs = {name: stages.STAGES[name].external_inputs
              for name in ("filter_curriculum", "train_policy")}
    before = {name: f(prior) for name, f in inputs.items() if f is not None}
    assert set(before) == set(inputs)
    monkeypatch.setattr(stages, "prior_fingerprint", lambda: "another release")
    for name, f in inputs.items():
        assert f is not None and f(prior) != before[name], name
    # Another model's keys do not read the package.
    assert inputs["filter_curriculum"](tiny) == ""  # type: ignore[misc]
    assert inputs["train_policy"](tiny) == "init:base"  # type: ignore[misc]


def test_a_shallower_prior_keeps_the_packages_first_layers_and_records_them(
        tmp_path: Path) -> None:
    source = resolve_encoder_path(BUNDLED_PRIOR)
    assert source is not None
    package = load_file(str(source / "model.safetensors"))
    out = prepare_prior(_world_texts()[:50], TAG_TOKENS, tmp_path / "p3", layers=3)
    model, _ = load_policy(out)
    state = model.state_dict()
    assert model.config.num_hidden_layers == 3
    assert not any(k.startswith("bert.encoder.layer.3.") for k in state)
    name = "encoder.layer.2.output.dense.weight"
    assert torch.equal(state[f"bert.{name}"], package[name])
    recorded = getattr(model.config, PRIOR_CONFIG_KEY)
    assert (recorded["layers"], recorded["source_layers"]) == (3, 6)


def test_prior_layers_is_refused_for_any_model_but_the_bundled_prior() -> None:
    base = tiny_config(Path("/tmp")).model_dump()
    base["model"] = {"kind": "pretrained", "name_or_path": "Qwen/Qwen2.5-0.5B",
                     "prior": {"layers": 3}}
    with pytest.raises(ValueError, match=r"model\.prior\.layers applies to the bundled prior"):
        PipelineConfig.model_validate(base)
    base["model"]["name_or_path"] = BUNDLED_PRIOR
    assert PipelineConfig.model_validate(base).model.prior.layers == 3


class _GoldSearcher:
    """Every passage titled as a query (the demonstrations' gold searches)."""

    def __init__(self, passages: list[Passage]) -> None:
        self.by_title = {p.title: p for p in passages}

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        return [[SearchHit(doc_id=p.id, title=p.title or "", contents=p.contents, score=1.0)
                 for p in [self.by_title[q.strip()]] if p] if q.strip() in self.by_title
                else [] for q in queries]


def test_demonstrations_start_as_the_prior_s_rollouts_start(prior_dir: Path) -> None:
    """SFT and PPO-ptx rows begin with the [CLS] the rollout's prompt begins with (they were
    once encoded without it: the cold start learnt from contexts no rollout ever had)."""
    config = tiny_config(Path("/tmp"))
    world = generate_world(config.data.synthetic)
    examples = world.splits["train"][:3]
    searcher = _GoldSearcher(world.passages)
    demos, _ = build_demos(examples, {p.id: p for p in world.passages}, searcher,
                           **demo_kwargs(config, gold_only=True))
    model, tok = load_policy(prior_dir)
    batch = run_rollouts(examples, HFGenerator(model, tok), searcher, config.rollout,
                         config.reward, group_size=1, greedy=True, mode="no_search")
    rows = {demo.example_id: tokenize_demo(demo, tok, max_len=4096).input_ids
            for demo in demos}
    assert len(rows) == len(batch.records) == 3
    for record in batch.records:
        ids = rows[record.example_id]
        assert record.prompt_ids[0] == tok.cls_token_id
        assert ids[:len(record.prompt_ids)] == record.prompt_ids


def test_every_prompt_ends_with_the_same_cue_whatever_the_question_s_punctuation(
        prior_dir: Path) -> None:
    """The policy starts writing after a constant cue, not right after the question: a question
    phrased as a request ("Tell me ... .") once ended its prompt differently from the "?" of
    every cold-start question, and the policy kept writing the question instead of opening
    its <think> (tuning world 101: 7-11% of those rollouts opened with <think>, all others
    did; docs/results/prior.md)."""
    _, tok = load_policy(prior_dir)
    asked = tok(build_prompt("Who founded Mutheix?"))["input_ids"]
    told = tok(build_prompt("Tell me who founded Mutheix."))["input_ids"]
    common = 0
    while asked[-1 - common] == told[-1 - common]:
        common += 1
    cue = tok.decode(asked[-common:], skip_special_tokens=True).strip()
    assert cue.startswith("response")  # the cue, and nothing of the question, is shared
    assert "mutheix" not in cue
