"""The steward queue in a running Label Studio, over its HTTP API.

Label Studio runs apart from the pipeline (`make steward-env` puts it in `.venv-steward/`:
its pins, pyarrow<25 among them, conflict with ours), so this talks to it with httpx:

    python -m searchrl.eval.label_studio_api push --suspects DIR/suspect_labels.jsonl \
        [--project TITLE]        # the queue (its .label_studio.json) into a project
    python -m searchrl.eval.label_studio_api push --validation RUN/validate_gold_labels
                                 # validation's suspects (flagged, kept rows) likewise
    python -m searchrl.eval.label_studio_api pull --project TITLE --out export.json
                                 # the project's JSON export, for `apply-audit --decisions`

Server and credentials: $LABEL_STUDIO_URL and $LABEL_STUDIO_API_KEY, a personal access token
(Account & Settings; exchanged for an access token at /api/token/refresh) or a legacy token.
A push is idempotent: the project is found by title, and tasks whose `key` it holds already
are not imported again. A pull names each annotation's steward by e-mail (resolved through
/api/users), so the overrides file records who decided (`searchrl.eval.label_studio`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from searchrl.datasets.io import atomic_write_text
from searchrl.eval.label_studio import CONFIG_FILE, LABEL_CONFIG, TASKS_SUFFIX
from searchrl.eval.validation_queue import write_validation_queue

URL_ENV, KEY_ENV = "LABEL_STUDIO_URL", "LABEL_STUDIO_API_KEY"
DEFAULT_PROJECT = "searchrl label audit"
PAGE = 100
TIMEOUT_S = 120.0  # an import or export of a large queue on a busy server
SERVICE_EXIT = 7  # searchrl.exit_codes: a service refused or is unreachable


class LabelStudioError(RuntimeError):
    """Label Studio refused a request or is unreachable; names the URL and the fix."""


def _check(resp: httpx.Response, what: str) -> httpx.Response:
    if resp.status_code >= 400:
        raise LabelStudioError(f"Label Studio at {resp.request.url} refused to {what}: "
                               f"HTTP {resp.status_code} {resp.text[:300]}")
    return resp


def token_headers(base_url: str, token: str) -> dict[str, str]:
    """Authorization for a personal access token (a JWT: exchanged for an access token) or a
    legacy token (sent as is; an organisation may have disabled those)."""
    if token.count(".") == 2:
        try:
            resp = httpx.post(base_url.rstrip("/") + "/api/token/refresh",
                              json={"refresh": token}, timeout=TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise LabelStudioError(f"Label Studio at {base_url} is unreachable ({exc}); "
                                   f"check ${URL_ENV}") from exc
        _check(resp, f"accept the personal access token in ${KEY_ENV} (expired or revoked? "
                     "make a new one under Account & Settings)")
        return {"Authorization": f"Bearer {resp.json()['access']}"}
    return {"Authorization": f"Token {token}"}


class LabelStudio:
    """One Label Studio server: `client` carries the base URL and the credentials (a token's
    headers, or a browser session's cookies and CSRF header)."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    @classmethod
    def from_token(cls, base_url: str, token: str) -> LabelStudio:
        return cls(httpx.Client(base_url=base_url, headers=token_headers(base_url, token),
                                timeout=TIMEOUT_S))

    def _request(self, method: str, path: str, what: str, **kwargs: Any) -> httpx.Response:
        try:
            resp = self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise LabelStudioError(f"Label Studio at {self.client.base_url} is unreachable "
                                   f"({exc}); check ${URL_ENV} and that it runs") from exc
        return _check(resp, what)

    def project_id(self, title: str) -> int | None:
        resp = self._request("GET", "/api/projects", "list projects",
                             params={"title": title, "page_size": PAGE})
        body = resp.json()
        found = [p for p in (body.get("results", body) if isinstance(body, dict) else body)
                 if p.get("title") == title]
        return int(found[0]["id"]) if found else None

    def ensure_project(self, title: str, label_config: str = LABEL_CONFIG) -> int:
        """The project called `title`, made with the audit's labeling config if missing."""
        existing = self.project_id(title)
        if existing is not None:
            return existing
        resp = self._request("POST", "/api/projects", f"create project {title!r}",
                             json={"title": title, "label_config": label_config})
        return int(resp.json()["id"])

    def tasks(self, project: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        page = 1
        while True:
            resp = self.client.get("/api/tasks", params={"project": project, "page": page,
                                                         "page_size": PAGE})
            if resp.status_code == 404 and out:  # past the last page
                return out
            body = _check(resp, f"list the tasks of project {project}").json()
            batch = body.get("tasks", []) if isinstance(body, dict) else body
            out += batch
            if len(batch) < PAGE:
                return out
            page += 1

    def import_tasks(self, project: int, tasks: list[dict[str, Any]]) -> int:
        """Import the tasks whose `data.key` the project does not hold yet; how many."""
        held = {t["data"].get("key") for t in self.tasks(project)}
        new = [t for t in tasks if t["data"].get("key") not in held]
        if new:
            self._request("POST", f"/api/projects/{project}/import",
                          f"import tasks into project {project}", json=new)
        return len(new)

    def annotate(self, task: int, result: list[dict[str, Any]]) -> dict[str, Any]:
        """Submit an annotation as the client's user (what the browser's Submit does)."""
        resp = self._request("POST", f"/api/tasks/{task}/annotations/",
                             f"annotate task {task}", json={"result": result})
        return dict(resp.json())

    def export(self, project: int) -> list[dict[str, Any]]:
        """The project's JSON export, each annotation's `completed_by` as {id, email}."""
        resp = self._request("GET", f"/api/projects/{project}/export",
                             f"export project {project}",
                             params={"exportType": "JSON", "download_all_tasks": "true"})
        tasks: list[dict[str, Any]] = resp.json()
        users = self._request("GET", "/api/users", "list users").json()
        emails = {u["id"]: u.get("email") for u in users if isinstance(u, dict)}
        for task in tasks:
            for annotation in task.get("annotations") or []:
                who = annotation.get("completed_by")
                if isinstance(who, int) and emails.get(who):
                    annotation["completed_by"] = {"id": who, "email": emails[who]}
        return tasks


def push_suspects(ls: LabelStudio, suspects: Path, title: str = DEFAULT_PROJECT
                  ) -> tuple[int, int]:
    """The evaluate stage's queue for `suspects` (its `.label_studio.json` and labeling
    config beside it) into project `title`; (project id, tasks imported)."""
    tasks_path = suspects.with_name(suspects.stem + TASKS_SUFFIX)
    if not tasks_path.is_file():
        raise FileNotFoundError(f"{tasks_path}: no Label Studio tasks beside {suspects}; the "
                                "evaluate stage writes them with the suspects file")
    config = suspects.with_name(CONFIG_FILE)
    project = ls.ensure_project(title, config.read_text(encoding="utf-8")
                                if config.is_file() else LABEL_CONFIG)
    return project, ls.import_tasks(project, json.loads(tasks_path.read_text("utf-8")))


def pull_export(ls: LabelStudio, title: str, out: Path) -> Path:
    """Project `title`'s JSON export written to `out` (whole, or not at all)."""
    project = ls.project_id(title)
    if project is None:
        raise LabelStudioError(f"no Label Studio project titled {title!r} at "
                               f"{ls.client.base_url}; push the queue first")
    atomic_write_text(out, json.dumps(ls.export(project), indent=1, ensure_ascii=False))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m searchrl.eval.label_studio_api",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["push", "pull"])
    parser.add_argument("--suspects", type=Path, help="push: a suspect_labels*.jsonl")
    parser.add_argument("--validation", type=Path,
                        help="push: a validate stage's directory (its flagged, kept rows)")
    parser.add_argument("--project", default=DEFAULT_PROJECT, help="the project's title")
    parser.add_argument("--out", type=Path, help="pull: where to write the export")
    args = parser.parse_args(argv)
    url, token = os.environ.get(URL_ENV), os.environ.get(KEY_ENV)
    if not url or not token:
        print(f"set ${URL_ENV} (e.g. http://127.0.0.1:8080) and ${KEY_ENV} (a personal "
              "access token: Account & Settings in Label Studio)", file=sys.stderr)
        return 2
    pushing = args.suspects is not None or args.validation is not None
    if (args.command == "push") != pushing or (args.command == "pull") != (
            args.out is not None):
        print("push needs --suspects FILE or --validation DIR; pull needs --out FILE",
              file=sys.stderr)
        return 2
    try:
        ls = LabelStudio.from_token(url, token)
        if args.command == "push":
            suspects = args.suspects or write_validation_queue(args.validation)
            project, added = push_suspects(ls, suspects, args.project)
            print(json.dumps({"project": project, "imported": added}))
        else:
            print(json.dumps({"export": str(pull_export(ls, args.project, args.out))}))
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 4
    except LabelStudioError as exc:
        print(exc, file=sys.stderr)
        return SERVICE_EXIT
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
