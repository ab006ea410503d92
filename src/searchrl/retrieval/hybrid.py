"""Hybrid retrieval by weighted reciprocal rank fusion (Cormack et al., 2009).

    score(d) = sum_r  w_r / (k + rank_r(d))        rank 1-based; absent from r -> no term

RRF fuses ranks, not scores, so BM25's unbounded scores and cosine similarities need no
calibration against each other; `k` (60 in the paper) damps the head of each ranking.
"""

from __future__ import annotations

from collections.abc import Mapping

from searchrl.retrieval.bm25 import Ranking


def rrf_fuse(rankings: Mapping[str, list[Ranking]], weights: Mapping[str, float],
             top_k: int, k: int = 60) -> list[Ranking]:
    """Fuse per-retriever rankings (name -> one ranking per query) into one per query.

    A retriever missing from `weights` gets weight 0. Ties are broken by passage row so the
    result is deterministic. Every ranking list must hold the same number of queries.
    """
    lists = [(weights.get(name, 0.0), per_query) for name, per_query in rankings.items()]
    n_queries = {len(per_query) for _, per_query in lists}
    if len(n_queries) > 1:
        raise ValueError(f"rankings disagree on the number of queries: {sorted(n_queries)}")
    fused: list[Ranking] = []
    for q in range(n_queries.pop() if n_queries else 0):
        scores: dict[int, float] = {}
        for weight, per_query in lists:
            if weight <= 0:
                continue
            for rank, (row, _) in enumerate(per_query[q], start=1):
                scores[row] = scores.get(row, 0.0) + weight / (k + rank)
        best = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:top_k]
        fused.append(best)
    return fused
