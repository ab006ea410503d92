"""Tell a Prefect server that the gold set changed, without importing prefect.

The library stays Prefect-free (tests/unit/test_architecture.py), yet the steward CLIs
(`apply-audit`, `prepare-data`) should start the deployment that retrains on the new gold set:
prefect.yaml's trigger listens for `searchrl.gold-set.updated`. So the event is posted to the
server's REST API (`POST {PREFECT_API_URL}/events`, the body Prefect's own clients send) with
httpx, only when `PREFECT_API_URL` is set. Auth as Prefect's client does it: `PREFECT_API_KEY`
as a bearer token (Prefect Cloud), else `PREFECT_API_AUTH_STRING` as basic auth (a
self-hosted server). A failed post is a warning on stderr: the files are written, and a
steward can start the run by hand.
"""

from __future__ import annotations

import base64
import os
import sys
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx

GOLD_SET_UPDATED = "searchrl.gold-set.updated"
GOLD_SET_RESOURCE = "searchrl.gold-set"
TIMEOUT_S = 10.0


def _headers() -> dict[str, str]:
    key = os.environ.get("PREFECT_API_KEY")
    if key:
        return {"Authorization": f"Bearer {key}"}
    auth = os.environ.get("PREFECT_API_AUTH_STRING")
    if auth:
        return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}
    return {}


def post_event(event: str, resource_id: str, payload: dict[str, Any],
               api_url: str | None = None) -> bool:
    """Post one event; True when the server took it, False when no API is configured or the
    post failed (warned on stderr, naming the URL and the fix)."""
    url = api_url or os.environ.get("PREFECT_API_URL")
    if not url:
        return False
    body = [{"id": str(uuid.uuid4()), "occurred": datetime.now(UTC).isoformat(),
             "event": event, "resource": {"prefect.resource.id": resource_id},
             "related": [], "payload": payload}]
    try:
        resp = httpx.post(url.rstrip("/") + "/events", json=body, headers=_headers(),
                          timeout=TIMEOUT_S)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        print(f"warning: could not post {event} to {url}/events ({exc}); the files are "
              "written: start the pipeline deployment by hand, or check PREFECT_API_URL and "
              "its credentials", file=sys.stderr)
        return False
    return True


def gold_set_updated(source: str, *, api_url: str | None = None, **details: Any) -> bool:
    """`searchrl.gold-set.updated` from `source` (the command), with what it wrote."""
    return post_event(GOLD_SET_UPDATED, f"{GOLD_SET_RESOURCE}.{source}",
                      {"source": source, **{k: str(v) for k, v in details.items()}}, api_url)
