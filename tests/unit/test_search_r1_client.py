"""The retrieval server as Search-R1's own trainer uses it (issue 44, section 5).

Search-R1's trainer (`search_r1/llm_agent/generation.py`) posts every active rollout's query
in one `/retrieve` request (`queries`, `topk`, `return_scores: true`; a training batch is
thousands) and reads each hit's `document.contents` as FlashRAG's wiki-18 rows are laid
out: the title is the text before the first newline (`"Title"`, quotes included), the
passage text is what follows. The client below is written that way, against the real server
(uvicorn) over a BM25 index of the demo's world (passages stored as `Title. text`) plus
HotpotQA rows already in that layout (`"Title"\\ntext`), which must not get a second title
line. Our own client must still get exactly what an in-process search returns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from searchrl.config import IndexConfig, load_config
from searchrl.datasets.io import read_qa
from searchrl.datasets.reading_world import generate_reading_world
from searchrl.datasets.world import write_world
from searchrl.retrieval.client import RetrievalClient
from searchrl.retrieval.index_store import LocalSearcher, build_index, load_corpus_searcher
from searchrl.retrieval.server import create_app
from searchrl.sinks import NullSink
from searchrl.types import Passage
from tests.helpers import serving

HOTPOT = Path(__file__).resolve().parents[2] / "data" / "hotpotqa_train100"
# The server's default limits, as a Search-R1 user would start it: nothing shrunk.
CONFIG = IndexConfig(retriever="bm25", eval_all_retrievers=False)
SEARCH_R1_TOP_K = 3  # Search-R1's `retriever.topk` default


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The demo world's passages plus 60 HotpotQA rows; their BM25 index; questions of both."""
    tmp = tmp_path_factory.mktemp("search_r1")
    world = generate_reading_world(load_config("configs/tiny.yaml", []).data.synthetic)
    paths = write_world(world, tmp / "world")
    hotpot_rows = (HOTPOT / "corpus.jsonl").read_text().splitlines(keepends=True)[:60]
    corpus_path = tmp / "corpus.jsonl"
    corpus_path.write_text(paths["corpus"].read_text() + "".join(hotpot_rows))
    build_index(corpus_path, tmp / "index", CONFIG, None, NullSink(), progress=False)
    passages = {p.id: p for p in world.passages}
    passages.update((row["id"], Passage.model_validate(row))
                    for row in map(json.loads, hotpot_rows))
    questions = [ex.question for split in ("train", "dev", "test")
                 for ex in read_qa(paths[split])]
    questions += [ex.question for ex in read_qa(HOTPOT / "questions.jsonl")]
    return {"index": tmp / "index", "passages": passages, "questions": questions}


@pytest.fixture(scope="module")
def searcher(corpus: dict[str, Any]) -> LocalSearcher:
    return load_corpus_searcher(corpus["index"], CONFIG)


def search_r1_batch_search(url: str, queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
    """Search-R1's `_batch_search`: every query in one POST. (Ours checks the status, so a
    refusal fails here with the server's reason rather than as a missing 'result'.)"""
    resp = httpx.post(f"{url}/retrieve", timeout=120.0,
                      json={"queries": queries, "topk": topk, "return_scores": True})
    assert resp.status_code == 200, f"HTTP {resp.status_code}: {resp.text[:300]}"
    result: list[list[dict[str, Any]]] = resp.json()["result"]
    return result


def search_r1_title_and_text(hit: dict[str, Any]) -> tuple[str, str]:
    """Search-R1's `_passages2string`: the title is the first line of `contents`, the text
    the lines after it."""
    lines = hit["document"]["contents"].split("\n")
    return lines[0], "\n".join(lines[1:])


def test_a_search_r1_sized_batch_is_served_in_one_post(
        corpus: dict[str, Any], searcher: LocalSearcher) -> None:
    """The server's default limits take a training batch in one request (it answered 413
    above 256 queries); the answer is the in-process search's, query by query, in order."""
    questions: list[str] = corpus["questions"]
    queries = (questions * (1 + 1500 // len(questions)))[:1500]
    app = create_app(searcher, CONFIG)
    with serving(app) as url:
        result = search_r1_batch_search(url, queries, SEARCH_R1_TOP_K)
    expected = searcher.search_batch(queries, SEARCH_R1_TOP_K)
    assert [[hit["document"]["id"] for hit in per_query] for per_query in result] == \
        [[hit.doc_id for hit in per_query] for per_query in expected]
    assert [[hit["score"] for hit in per_query] for per_query in result] == \
        [[pytest.approx(hit.score) for hit in per_query] for per_query in expected]
    totals = app.state.monitor.snapshot()["totals"]
    assert (totals["served"], totals["queries"], totals["largest_batch"]) == (1, 1500, 1500)


def test_search_r1_reads_each_passages_real_title_and_text(
        corpus: dict[str, Any], searcher: LocalSearcher) -> None:
    """`contents` is FlashRAG's layout for every passage: `"Title"`, a newline, the text.
    The demo's `Title. text` passages get the title line (their text is the passage as
    stored); HotpotQA's rows, already laid out so, are not given a second one."""
    passages: dict[str, Passage] = corpus["passages"]
    queries = [q for q in corpus["questions"] if q][::7]
    with serving(create_app(searcher, CONFIG)) as url:
        result = search_r1_batch_search(url, queries, SEARCH_R1_TOP_K)
        bare = httpx.post(f"{url}/retrieve", json={"queries": queries[:5], "topk": 2},
                          timeout=30.0).json()["result"]
    kinds = set()
    for per_query in result:
        for hit in per_query:
            passage = passages[hit["document"]["id"]]
            assert passage.title
            title, text = search_r1_title_and_text(hit)
            assert title == f'"{passage.title}"', hit
            # The title line is not repeated in the text (a real passage may quote its title).
            assert text and not text.startswith(f'"{passage.title}"'), hit
            assert text == passage.contents.removeprefix(f'"{passage.title}"\n'), hit
            kinds.add(passage.id[:2])
    assert kinds == {"sy", "hp"}  # both layouts were served
    for per_query in bare:  # without scores each hit is the bare document, laid out alike
        for doc in per_query:
            assert doc["contents"].split("\n")[0] == f'"{passages[doc["id"]].title}"'


def test_our_client_gets_exactly_the_inprocess_hits(
        corpus: dict[str, Any], searcher: LocalSearcher) -> None:
    """The rollout sees the same passages over HTTP as in-process (results never depend on
    index.mode): our client undoes the title line the server added, and only that."""
    queries = corpus["questions"][::3]
    with serving(create_app(searcher, CONFIG, token="t0k")) as url:
        client = RetrievalClient(url, token="t0k", retries=0, timeout_s=60.0)
        served = client.search_batch(queries, SEARCH_R1_TOP_K)
        client.close()
    assert served == searcher.search_batch(queries, SEARCH_R1_TOP_K)
    assert {hit.doc_id[:2] for per_query in served for hit in per_query} == {"sy", "hp"}


def test_our_client_reads_the_title_line_of_search_r1s_own_server() -> None:
    """Search-R1's server sends corpus rows as stored (`{id, contents}`, no title): the
    title is taken from the `"Title"` line, as an in-process load of that corpus does, and
    the contents are left as they are."""
    def search_r1_server(request: httpx.Request) -> httpx.Response:
        if request.url.path != "/retrieve":
            return httpx.Response(404, json={"detail": "Not Found"})
        docs = [{"id": "0", "contents": '"Paris"\nParis is the capital of France.'},
                {"id": "1", "contents": "An untitled passage.\nSecond line."}]
        return httpx.Response(200, json={"result": [[{"document": d, "score": 1.0}
                                                     for d in docs]]})

    client = RetrievalClient("http://svc", retries=0,
                             transport=httpx.MockTransport(search_r1_server))
    [hits] = client.search_batch(["capital of France"], 2)
    assert [(h.title, h.contents) for h in hits] == [
        ("Paris", '"Paris"\nParis is the capital of France.'),
        (None, "An untitled passage.\nSecond line.")]
