"""The retrieval service answering 5xx during rollouts, through the real HTTP client
(`searchrl.retrieval.client`) against a tiny local HTTP server, with a tiny policy that
really searches:

- always 500: each search call is retried a bounded number of times, then the failure is an
  `<information>` observation the policy sees (mask 0) and a counted metric; no exception,
  no empty result passed off as a search; a GRPO step with it completes and logs the count;
- 500 twice then 200: the retries absorb it, the hits come through, nothing is counted.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from searchrl.config import PipelineConfig, RewardConfig, RolloutConfig
from searchrl.generation.hf import HFGenerator
from searchrl.retrieval.client import RetrievalClient
from searchrl.rl.rollout import (
    RetrieverFailedError,
    RolloutBatch,
    check_search_failures,
    run_rollouts,
)
from searchrl.types import QAExample
from tests.tagged_policy import WORDS, demo_tokenizer
from tests.tagged_policy import searching_model as train_searching_model

if TYPE_CHECKING:
    from searchrl.train.grpo.trainer import TrainResult

RETRIES = 2  # so every search call is exactly 3 HTTP requests
EXAMPLES = [QAExample(id=f"q{i}", question=f"what about {WORDS[i]}?",
                      golden_answers=(WORDS[i + 1],)) for i in range(3)]
ROLLOUT = RolloutConfig(max_turns=2, max_new_tokens_per_turn=14, max_response_tokens=400,
                        top_k=1, info_token_budget=300)
# Failed searches as observations only (what the limit counts is tested on its own below).
TOLERANT = ROLLOUT.model_copy(update={"max_search_failure_rate": 1.0})


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerBase:
    return demo_tokenizer()


@pytest.fixture(scope="module")
def searching_model(tok: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A tiny model briefly trained on tag-structured demos, so its rollouts search."""
    return train_searching_model(tok)


# --- a tiny retrieval service that fails on purpose


class FailingService:
    """HTTP server on a free loopback port. Every request whose 0-based index `i` has
    `i % period != period - 1` gets 500; the others get a Search-R1-shaped 200 (period 0:
    always 500). Records (method, path, body) of every request."""

    def __init__(self, period: int = 0) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                if self.path == "/limits":  # none advertised, as Search-R1's server
                    self._send(404, {"detail": "Not Found"})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with lock:
                    service.requests.append((self.command, self.path, body))
                    index = len(service.requests) - 1
                if period and index % period == period - 1 and body is not None:
                    payload = {"result": [[{"document": {"id": f"doc-{q}",
                                                         "contents": f"{q} is w7"},
                                            "score": 1.0}] for q in body["queries"]]}
                    self._send(200, payload)
                else:
                    self._send(500, {"detail": "index shard offline"})

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                return None  # keep test output clean

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def down() -> Iterator[FailingService]:
    service = FailingService()
    yield service
    service.close()


@contextmanager
def _client(service: FailingService) -> Iterator[RetrievalClient]:
    """A client of `service` with the tests' retries, closed after the block."""
    client = RetrievalClient(service.url, timeout_s=5.0, retries=RETRIES, backoff_s=0.01)
    try:
        yield client
    finally:
        client.close()


def _rollouts(model: PreTrainedModel, tok: PreTrainedTokenizerBase,
              client: RetrievalClient, cfg: RolloutConfig = TOLERANT) -> RolloutBatch:
    return run_rollouts(EXAMPLES, HFGenerator(model, tok), client, cfg, RewardConfig(),
                        group_size=2, greedy=True)


# --- always 500


def test_service_500_becomes_an_observation_and_a_counted_metric(
        searching_model: PreTrainedModel, tok: PreTrainedTokenizerBase,
        down: FailingService) -> None:
    with _client(down) as client:
        batch = _rollouts(searching_model, tok, client)  # must not raise
    records, stats = batch.records, batch.stats
    searches = sum(len(r.queries) for r in records)
    assert searches >= len(records)  # the policy really searched: the fault was exercised
    # Bounded retries: each search call is exactly RETRIES + 1 requests, then it gives up.
    assert stats["search_calls"] >= 1
    assert len(down.requests) == (RETRIES + 1) * stats["search_calls"]
    assert {(m, p) for m, p, _ in down.requests} == {("POST", "/retrieve")}
    sent = {q for _, _, body in down.requests for q in body["queries"]}
    assert {q for r in records for q in r.queries} <= sent
    # Every failed search is counted, per record and in the batch stats.
    assert stats["search_errors"] == searches and stats["search_error_rate"] == 1.0
    for r in records:
        assert r.search_errors == len(r.queries)
        # No empty result passed off as a search: nothing was retrieved, and it says why.
        assert r.retrieved_doc_ids == [[] for _ in r.queries]
        assert r.passages == [[] for _ in r.queries]
        info = _info_text(r.segments, r.response_ids, tok)
        assert len(info) == len(r.queries)
        for block in info:
            assert "Search failed" in block and "HTTP 500" in block, block
            assert f"failed after {RETRIES + 1} attempts" in block, block
        # The observation is context, not policy output: loss mask 0 over it.
        for kind, start, end in r.segments:
            assert all(m == (1 if kind == "sampled" else 0)
                       for m in r.loss_mask[start:end]), (kind, start, end)


def _info_text(segments: list[tuple[str, int, int]], ids: list[int],
               tok: PreTrainedTokenizerBase) -> list[str]:
    """Decoded <information> blocks (consecutive `info` segments joined)."""
    blocks: list[list[int]] = []
    previous = ""
    for kind, start, end in segments:
        if kind == "info":
            if previous != "info":
                blocks.append([])
            blocks[-1].extend(ids[start:end])
        previous = kind
    return [str(tok.decode(b, skip_special_tokens=False)) for b in blocks]


def test_a_dead_service_past_the_limit_fails_the_rollout_naming_it(
        searching_model: PreTrainedModel, tok: PreTrainedTokenizerBase,
        down: FailingService) -> None:
    with _client(down) as client, pytest.raises(RetrieverFailedError) as caught:
        _rollouts(searching_model, tok, client, ROLLOUT)  # the default limit
    message = str(caught.value)
    assert f"retrieval service {client.url}/retrieve" in message  # which service
    assert "HTTP 500" in message  # its last error
    assert re.search(r"\b(\d+) of \1 search calls failed", message)  # all of them, counted
    assert "rollout.max_search_failure_rate" in message


def test_failures_under_the_limit_stay_observations() -> None:
    cfg = RolloutConfig(max_search_failure_rate=0.5, min_search_failures=2)
    check_search_failures(1, 1, cfg, "x")  # one failure: under min_search_failures
    check_search_failures(2, 4, cfg, "x")  # half: not more than half
    with pytest.raises(RetrieverFailedError, match="3 of 4 search calls failed"):
        check_search_failures(3, 4, cfg, "boom")


# --- transient 500s within the retry budget


def test_transient_500s_are_absorbed_by_the_retries(
        searching_model: PreTrainedModel, tok: PreTrainedTokenizerBase) -> None:
    service = FailingService(period=RETRIES + 1)  # 500, 500, then 200, for every call
    try:
        with _client(service) as client:
            batch = _rollouts(searching_model, tok, client)
    finally:
        service.close()
    records = batch.records
    assert batch.stats["search_calls"] >= 1
    assert len(service.requests) == (RETRIES + 1) * batch.stats["search_calls"]
    assert batch.stats["search_errors"] == 0
    for r in records:
        assert r.search_errors == 0
        assert r.retrieved_doc_ids == [[f"doc-{q}"] for q in r.queries]
        assert "Search failed" not in "".join(_info_text(r.segments, r.response_ids, tok))


# --- a GRPO step against the failing service


def _grpo_one_step(tmp_path: Path, model: PreTrainedModel, tok: PreTrainedTokenizerBase,
                   service: FailingService, rollout: RolloutConfig, *, checkpoint_every: int
                   ) -> tuple[TrainResult, PipelineConfig]:
    """One GRPO step from the searching model (saved as the start policy) into
    `tmp_path/out`, searching `service`: train_grpo's result and the config it ran."""
    from searchrl.train.cold_start.sft import save_policy
    from searchrl.train.grpo.trainer import train_grpo

    init = tmp_path / "init"
    save_policy(model, tok, init)
    config = PipelineConfig.model_validate({
        "run": {"device": "cpu", "work_dir": str(tmp_path), "seed": 1},
        "rollout": rollout.model_dump(mode="json") | {"group_size": 2},
        "curriculum": {"dynamic_filtering": False},
        "train": {"steps": 1, "questions_per_step": 2, "micro_batch_size": 4,
                  "checkpoint_every": checkpoint_every, "kl_coef": 0.0},
    })
    with _client(service) as client:
        return train_grpo(config, EXAMPLES, client, init, tmp_path / "out",
                          progress=False), config


def test_grpo_step_with_the_service_down_fails_instead_of_training(
        tmp_path: Path, searching_model: PreTrainedModel, tok: PreTrainedTokenizerBase,
        down: FailingService) -> None:
    with pytest.raises(RetrieverFailedError, match="search calls failed"):
        _grpo_one_step(tmp_path, searching_model, tok, down, ROLLOUT, checkpoint_every=1)
    # Nothing was trained on the errors: no step logged, no checkpoint, no final policy.
    metrics = tmp_path / "out" / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text().strip() == ""
    assert not list((tmp_path / "out").glob("checkpoints/step_*"))
    assert not (tmp_path / "out" / "policy").exists()


def test_grpo_step_with_failures_tolerated_completes_and_logs_the_errors(
        tmp_path: Path, searching_model: PreTrainedModel, tok: PreTrainedTokenizerBase,
        down: FailingService) -> None:
    result, config = _grpo_one_step(tmp_path, searching_model, tok, down, TOLERANT,
                                    checkpoint_every=0)
    assert result.steps_done == 1 and result.skipped_steps == 0
    row = json.loads((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()[0])
    rollouts = config.train.questions_per_step * config.rollout.group_size
    # The rollouts searched (the fixture's policy does on most of them), and every search
    # failed and was counted as an error instead of stopping the step.
    assert row["searches_per_rollout"] > 0
    assert row["search_errors"] == row["searches_per_rollout"] * rollouts
    assert len(down.requests) % (RETRIES + 1) == 0 and down.requests
    assert torch.isfinite(torch.tensor(row["loss"]))
