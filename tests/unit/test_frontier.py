"""The frontier baseline: the agentic rollout loop driving an OpenAI-compatible `/v1/completions`
endpoint. The endpoint is real: a FastAPI app under uvicorn on 127.0.0.1 (a free port) serving
the project's own tiny searching policy in vLLM's answer shape (stop string left out of `text`,
named in `stop_reason`; `usage` counted). Greedy through the endpoint gives the same answers,
searches, EM and completion tokens as the same policy in-process; tokens per query come from
the endpoint's usage; a spent request budget marks the system incomplete and fails the gate's
accuracy condition; a dead endpoint and a missing key fail with the fix in the message."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Body, FastAPI, Header, HTTPException
from transformers import PreTrainedTokenizerBase

from searchrl.config import PipelineConfig
from searchrl.eval.baselines import FRONTIER, TRAINED, plan_systems
from searchrl.eval.results import EvalResult, read_question_results
from searchrl.eval.run import evaluate
from searchrl.gate.payback import StageCost
from searchrl.gate.render import render_markdown
from searchrl.gate.report import build_gate
from searchrl.generation.base import Generator, SamplingParams
from searchrl.generation.factory import make_generator
from searchrl.generation.openai_compat import (
    MISSING,
    EndpointError,
    OpenAICompatGenerator,
    stop_hit,
)
from searchrl.rl.prompts import STOP_STRINGS
from searchrl.train.cold_start.sft import save_policy
from searchrl.types import QAExample, SearchHit
from tests.helpers import free_port, serving
from tests.tagged_policy import WORDS, demo_tokenizer, searching_model

ROLLOUT = {"max_turns": 2, "max_new_tokens_per_turn": 14, "max_response_tokens": 400,
           "top_k": 1, "info_token_budget": 300}


def _next(word: str) -> str:
    i = WORDS.index(word) if word in WORDS else 0
    return WORDS[(i * 7 + 3) % len(WORDS)]


EXAMPLES = [QAExample(id=f"q{i}", question=f"what about {WORDS[i]}?",
                      golden_answers=(_next(_next(WORDS[i])),), hops=2) for i in range(6)]


class WordSearcher:
    """Deterministic in-memory search over the word world: `w` -> "w is <next(w)>"."""

    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        out = []
        for q in queries:
            word = q.strip().split()[0] if q.strip() else "w0"
            out.append([SearchHit(f"doc-{word}", None, f"{word} is {_next(word)}", 1.0)])
        return out


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return demo_tokenizer()


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory, tok: PreTrainedTokenizerBase) -> Path:
    out = tmp_path_factory.mktemp("frontier") / "policy"
    save_policy(searching_model(tok), tok, out)
    return out


def _config(work: Path, **frontier: Any) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "run": {"device": "cpu", "work_dir": str(work)}, "rollout": ROLLOUT,
        "eval": {"baselines": [], "bootstrap_samples": 100, "batch_size": 3,
                 "frontier": ({"model": "tiny-searcher", "max_context_tokens": 1024,
                               "price_per_1k_prompt_tokens": 0.002,
                               "price_per_1k_completion_tokens": 0.008,
                               "retries": 1, "backoff_s": 0.01, "timeout_s": 30} | frontier)
                 if frontier else None},
        "gate": {"min_gold_pairs": 1, "min_accuracy_margin": 0.0}})


# --- the endpoint: the tiny policy over /v1/completions


class CompletionServer:
    """`/v1/completions` over a local generator, answering as vLLM does (or, `name_stop`
    off, as the OpenAI API does: no `stop_reason`). Counts every request and the tokens it
    reported; requires `Bearer <api_key>` when one is given."""

    def __init__(self, generator: Generator, api_key: str | None = None) -> None:
        self.generator = generator
        self.name_stop = True
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.authorization: list[str | None] = []
        self.app = FastAPI()
        self.app.post("/v1/completions")(self._complete_route(api_key))

    def _complete_route(self, api_key: str | None) -> Any:
        def complete(body: dict[str, Any] = Body(...),  # noqa: B008 (FastAPI's idiom)
                     authorization: str | None = Header(None)) -> dict[str, Any]:
            with self.lock:
                self.authorization.append(authorization)
            if api_key is not None and authorization != f"Bearer {api_key}":
                raise HTTPException(401, "invalid api key")
            return self.complete(body)

        return complete

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        tok = self.generator.tokenizer
        ids = list(tok(body["prompt"], add_special_tokens=True)["input_ids"])
        greedy = float(body.get("temperature", 1.0)) == 0.0
        stops = tuple(body.get("stop") or ())
        params = SamplingParams(max_new_tokens=int(body["max_tokens"]), greedy=greedy,
                                temperature=1.0 if greedy else float(body["temperature"]),
                                stop=stops)
        with self.lock:  # one generation at a time: the generator is not thread-safe
            out = self.generator.generate([ids], params, seed=int(body.get("seed", 0)))[0]
            self.requests.append(body)
            self.prompt_tokens += len(ids)
            self.completion_tokens += len(out.token_ids)
        text_ids, stop_reason = list(out.token_ids), None
        if out.finish_reason == "eos":
            text_ids = text_ids[:-1]
        text = str(tok.decode(text_ids, skip_special_tokens=False,
                              clean_up_tokenization_spaces=False))
        if out.finish_reason == "stop":
            stop_reason = next(s for s in stops if text.endswith(s))
            text = text[: -len(stop_reason)]
        choice = {"index": 0, "text": text, "logprobs": None,
                  "finish_reason": "length" if out.finish_reason == "length" else "stop"}
        if self.name_stop:
            choice["stop_reason"] = stop_reason
        return {"id": "cmpl-test", "object": "text_completion", "model": body["model"],
                "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(out.token_ids),
                          "total_tokens": len(ids) + len(out.token_ids)}}


@pytest.fixture(scope="module")
def endpoint(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[tuple[str, CompletionServer]]:
    config = _config(tmp_path_factory.mktemp("server"))
    server = CompletionServer(make_generator(config, policy_dir=policy_dir))
    with serving(server.app) as url:
        yield f"{url}/v1", server


def _evaluate(config: PipelineConfig, policy_dir: Path, out: Path) -> EvalResult:
    systems, _ = plan_systems(config.eval.baselines, policy_dir=str(policy_dir), sft_dir=None,
                              champion_dir=None, config=config)
    return evaluate(EXAMPLES, systems, WordSearcher(), config, out, eval_set="test:words")


# --- through the endpoint = in-process


@pytest.mark.parametrize("name_stop", [True, False], ids=["vllm", "openai"])
def test_frontier_through_the_endpoint_matches_the_policy_in_process(
        endpoint: tuple[str, CompletionServer], policy_dir: Path, tmp_path: Path,
        name_stop: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    url, server = endpoint
    monkeypatch.setattr(server, "name_stop", name_stop)
    before = (len(server.requests), server.prompt_tokens, server.completion_tokens)
    config = _config(tmp_path / "work", base_url=url)
    result = _evaluate(config, policy_dir, tmp_path / "eval")
    frontier, trained = result.systems[FRONTIER], result.systems[TRAINED]
    assert frontier.incomplete is None
    assert frontier.spec.description.startswith("tiny-searcher at http://127.0.0.1:")
    remote = read_question_results(frontier.questions_path)
    local = read_question_results(trained.questions_path)
    assert [r.example_id for r in remote] == [r.example_id for r in local]
    # Greedy: the same answers, searches and finishes, so the same EM.
    assert [r.answer for r in remote] == [r.answer for r in local]
    assert [r.searches for r in remote] == [r.searches for r in local]
    assert [r.finish_reason for r in remote] == [r.finish_reason for r in local]
    assert frontier.summary.em.mean == trained.summary.em.mean
    assert sum(r.searches for r in local) > 0  # the loop really inserted <information>
    # Tokens per query from the endpoint's usage: completions = what the policy generated;
    # prompts = every request's full context (re-sent each turn), as the server counted them.
    assert [r.response_tokens for r in remote] == [r.response_tokens for r in local]
    requests = len(server.requests) - before[0]
    assert requests == sum(r.searches for r in local) + len(EXAMPLES)  # one per turn
    assert sum(r.prompt_tokens for r in remote) == server.prompt_tokens - before[1]
    assert sum(r.response_tokens for r in remote) == server.completion_tokens - before[2]
    assert frontier.summary.tokens_per_query == pytest.approx(
        (server.prompt_tokens - before[1] + server.completion_tokens - before[2])
        / len(EXAMPLES))
    assert all(r.confidence is None for r in remote)  # no token log-probs from an endpoint
    assert all(body["temperature"] == 0.0 and body["stop"] == list(STOP_STRINGS)
               for body in server.requests[before[0]:])
    # The gate compares with the measured frontier and prices its measured tokens.
    decision, report = build_gate(config, result, gold_pairs=10,
                                  stages=[StageCost("training", 36.0, 1)], training_curve={})
    assert report.comparison_baseline == FRONTIER
    assert report.costs.frontier_tokens_per_query == frontier.summary.tokens_per_query
    s = frontier.summary
    blended = ((s.tokens_per_query - s.response_tokens) * 0.002
               + s.response_tokens * 0.008) / s.tokens_per_query
    assert report.costs.frontier_price_per_1k_tokens == pytest.approx(blended)
    accuracy = next(c for c in decision.checks if c.name == "accuracy")
    assert "stand-in" not in accuracy.detail and "vs frontier" in accuracy.detail
    assert "**Comparator: the frontier system, tiny-searcher" in render_markdown(report)
    assert "frontier tokens / query (measured" in render_markdown(report)


def test_a_spent_request_budget_marks_the_system_incomplete_and_fails_the_gate(
        endpoint: tuple[str, CompletionServer], policy_dir: Path, tmp_path: Path) -> None:
    url, server = endpoint
    before = len(server.requests)
    config = _config(tmp_path / "work", base_url=url, max_requests=4)
    result = _evaluate(config, policy_dir, tmp_path / "eval")
    frontier = result.systems[FRONTIER]
    assert frontier.incomplete is not None and "max_requests=4" in frontier.incomplete
    assert f"of {len(EXAMPLES)} questions answered" in frontier.incomplete
    assert len(server.requests) - before <= 4  # never past the budget
    assert frontier.summary.n < len(EXAMPLES)
    assert any("frontier is INCOMPLETE" in n for n in result.notes)
    saved = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert saved["systems"][FRONTIER]["incomplete"] == frontier.incomplete
    decision, report = build_gate(config, EvalResult.from_dict(saved), gold_pairs=10,
                                  stages=[StageCost("training", 36.0, 1)], training_curve={})
    assert not decision.go
    accuracy = next(c for c in decision.checks if c.name == "accuracy")
    assert not accuracy.passed and "not fully measured" in accuracy.detail
    assert "INCOMPLETE" in report.comparator


def test_a_dead_endpoint_fails_fast_with_the_fix(policy_dir: Path, tmp_path: Path) -> None:
    config = _config(tmp_path / "work", base_url=f"http://127.0.0.1:{free_port()}/v1",
                     timeout_s=2)
    start = time.perf_counter()
    with pytest.raises(EndpointError, match=r"failed after 2 attempts .*is the server running"):
        _evaluate(config, policy_dir, tmp_path / "eval")
    assert time.perf_counter() - start < 30
    # The frontier runs first: nothing of the local systems was spent on a doomed evaluation.
    assert not (tmp_path / "eval" / f"questions_{TRAINED}.jsonl").exists()


def test_the_key_comes_from_the_named_environment_variable(
        policy_dir: Path, tmp_path: Path, tok: PreTrainedTokenizerBase,
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = _config(tmp_path / "server")
    server = CompletionServer(make_generator(base, policy_dir=policy_dir), api_key="s3cret")
    monkeypatch.delenv("SEARCHRL_TEST_FRONTIER_KEY", raising=False)
    with serving(server.app) as url:
        config = _config(tmp_path, base_url=f"{url}/v1", api_key_env="SEARCHRL_TEST_FRONTIER_KEY")
        assert config.eval.frontier is not None
        with pytest.raises(EndpointError, match=r"\$SEARCHRL_TEST_FRONTIER_KEY is not set"):
            make_generator(config, tokenizer=tok, frontier=config.eval.frontier)
        monkeypatch.setenv("SEARCHRL_TEST_FRONTIER_KEY", "wrong")
        wrong = make_generator(config, tokenizer=tok, frontier=config.eval.frontier)
        prompt = list(tok("what about w1?")["input_ids"])
        params = SamplingParams(max_new_tokens=4, greedy=True, stop=STOP_STRINGS)
        with pytest.raises(EndpointError, match=r"HTTP 401.*check \$SEARCHRL_TEST_FRONTIER_KEY"):
            wrong.generate([prompt], params)
        monkeypatch.setenv("SEARCHRL_TEST_FRONTIER_KEY", "s3cret")
        right = make_generator(config, tokenizer=tok, frontier=config.eval.frontier)
        assert isinstance(right, OpenAICompatGenerator)
        out = right.generate([prompt], params, keys=["row"])
        assert out[0].token_ids and right.take_usage()["row"].requests == 1
        assert server.authorization[-1] == "Bearer s3cret"
        assert "s3cret" not in json.dumps(config.to_dict())  # the key never enters config


# --- pure pieces


def test_which_stop_string_ended_the_turn() -> None:
    stops = STOP_STRINGS
    assert stop_hit("", " x", stops, "</search>") == "</search>"  # vLLM names it
    assert stop_hit("", "<search> x", stops, None) is None  # vLLM: null = EOS
    # The OpenAI API names nothing: the tag left open last decides.
    assert stop_hit("Q", "<think> a </think><search> w1 ", stops, MISSING) == "</search>"
    assert stop_hit("Q<answer>", " w5 ", stops, MISSING) == "</answer>"  # forced answer
    assert stop_hit("Q<search> a </search><information>i</information>", "<think> b",
                    stops, MISSING) is None
    assert stop_hit("Q", "<answer> a </answer>", stops, MISSING) == "</answer>"  # included


def test_retries_then_a_malformed_answer_is_an_error(tok: PreTrainedTokenizerBase) -> None:
    config = _config(Path("/tmp"), base_url="http://frontier.test/v1", retries=2, backoff_s=0.0)
    answers = [httpx.Response(503, json={"error": {"message": "busy"}}),
               httpx.Response(200, json={"choices": [{"text": " w1 </answer>",
                                                      "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 9, "completion_tokens": 3}}),
               httpx.Response(200, json={"choices": [{"text": "x"}]})]
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers[len(seen) - 1]

    assert config.eval.frontier is not None
    gen = OpenAICompatGenerator(config.eval.frontier, tok,
                                transport=httpx.MockTransport(handler))
    params = SamplingParams(max_new_tokens=8, greedy=True, stop=STOP_STRINGS)
    out = gen.generate([list(tok("Q <answer>")["input_ids"])], params)[0]
    assert out.finish_reason == "stop" and gen.requests_made == 2
    assert str(seen[0].url) == "http://frontier.test/v1/completions"
    assert gen.take_usage()["0"].prompt_tokens == 9
    with pytest.raises(EndpointError, match="usage"):
        gen.generate([list(tok("Q")["input_ids"])], params)
