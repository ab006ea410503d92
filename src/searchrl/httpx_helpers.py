"""What every HTTP client here (the retrieval client and the frontier endpoint client) does
with an answer: retries with jittered backoff, how long the server asks us to wait, and its
error message."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

import httpx


def retry_after(resp: httpx.Response) -> float:
    """Retry-After in seconds (0 when absent or an HTTP date)."""
    try:
        value = float(resp.headers.get("retry-after", "0"))
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def error_detail(resp: httpx.Response) -> str:
    """The error message of a FastAPI (`detail`) or OpenAI-style (`error.message`) body."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:300]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body["error"]))[:300]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:300]
    return str(body)[:300]


# Worth another attempt: rate limited, timed out at the server, or a server-side error (5xx)
# unless the server marks it final with NO_RETRY_HEADER (our retrieval server does for a
# search that failed or ran past its timeout: the same request would fail again).
RETRY_STATUS = frozenset({408, 429})
NO_RETRY_HEADER = "X-No-Retry"

# Jitter from the OS, not the `random` module: every rank seeds that alike, and ranks backing
# off by the same delays would retry in lockstep.
_JITTER = random.SystemRandom()


def retry_delay(attempt: int, backoff_s: float, retry_after_s: float,
                rng: random.Random = _JITTER) -> float:
    """Seconds to wait before retry `attempt` (1, 2, ...): exponential backoff with equal
    jitter (between half and all of `backoff_s * 2**(attempt-1)`), and never less than the
    server's Retry-After, which is spread by up to a quarter so clients sent away together
    do not all come back at once."""
    base = backoff_s * 2.0 ** (attempt - 1)
    delay = base / 2 + rng.uniform(0.0, base / 2)
    return max(delay, retry_after_s * rng.uniform(1.0, 1.25)) if retry_after_s > 0 else delay


def _send_with_retries(send: Callable[[], httpx.Response], *, retries: int, backoff_s: float,
                       max_wait_s: float) -> tuple[httpx.Response | None, str]:
    """Call `send` up to `retries + 1` times, backing off (`retry_delay`, the server's
    Retry-After capped at `max_wait_s`) on transport errors, 408/429 and 5xx not marked
    final. Returns the first answer worth reading (any other status), or (None, the last
    error) when every attempt failed."""
    last, wait = "", 0.0
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(retry_delay(attempt, backoff_s, wait))
        wait = 0.0
        try:
            resp = send()
        except httpx.TransportError as exc:  # refused, reset, DNS, timeouts
            last = f"{type(exc).__name__}: {exc}"
            continue
        retryable = resp.status_code in RETRY_STATUS or resp.status_code >= 500
        if retryable and NO_RETRY_HEADER not in resp.headers:
            last = f"HTTP {resp.status_code}: {error_detail(resp)}"
            wait = min(retry_after(resp), max_wait_s)
            continue
        return resp, last
    return None, last


def request_json(send: Callable[[], httpx.Response], *, retries: int, backoff_s: float,
                 max_wait_s: float, where: str, error: type[Exception], unreachable: str,
                 auth_hint: str = "", absent_ok: bool = False) -> Any:
    """The JSON answer of `send` with retries as `_send_with_retries` does them; otherwise
    `error` naming `where`: every attempt failed (with the `unreachable` advice), the server
    rejected the request (4xx, with `auth_hint` on 401/403) or failed it for good (a 5xx
    marked final), or the answer is not JSON. `absent_ok`: None on 404 (no such endpoint)."""
    resp, last = _send_with_retries(send, retries=retries, backoff_s=backoff_s,
                                    max_wait_s=max_wait_s)
    if resp is None:
        raise error(f"{where} failed after {retries + 1} attempts ({last}); {unreachable}")
    if absent_ok and resp.status_code == 404:
        return None
    if resp.status_code >= 500:
        raise error(f"{where} failed (final, not retried): HTTP {resp.status_code}: "
                    f"{error_detail(resp)}")
    if resp.status_code >= 400:
        hint = auth_hint if resp.status_code in (401, 403) else ""
        raise error(f"{where} rejected the request: HTTP {resp.status_code}: "
                    f"{error_detail(resp)}{hint}")
    try:
        return resp.json()
    except ValueError as exc:
        raise error(f"{where}: answer is not JSON") from exc
