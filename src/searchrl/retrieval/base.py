"""The `Searcher` protocol rollouts talk to: in-process retrievers and the HTTP client alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from searchrl.types import SearchHit


class SearchError(RuntimeError):
    """A search could not be served (service down, bad response); never an empty result."""


class Searcher(Protocol):
    def search_batch(self, queries: Sequence[str], top_k: int) -> list[list[SearchHit]]:
        """One list of hits (best first) per query; raises SearchError on failure."""
        ...
