"""Stewards in a real Label Studio (slow; `make steward-env` installs it in .venv-steward/).

Label Studio starts in a temporary directory (sqlite, a free port). The queues of suspects (the
audit's, and validation's flagged rows) are pushed as tasks with the evidence passages
(searchrl.eval.label_studio_api, a personal access token); two stewards sign in through the
browser's forms (the second by the project's invite link) and submit annotations through the
API calls the browser makes; the export is pulled and applied by `apply-audit`: the agreed
correction lands in the overrides file with who, when and which annotation, the row the
stewards disagree on is a conflict (exit 1, nothing merged for it), and the next validation
trains on the corrected gold (the DatasetRef, whose fingerprint keys the train stage, changes;
tests/flows/test_steward_changes.py follows an override into retraining). Label Studio is
stopped at the end and leaves no process behind.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from searchrl.__main__ import main
from searchrl.datasets.io import read_qa
from searchrl.eval.audit import GOLD_LIKELY_WRONG, pool_suspects
from searchrl.eval.label_studio import write_label_studio
from searchrl.eval.label_studio_api import (
    KEY_ENV,
    URL_ENV,
    LabelStudio,
)
from searchrl.eval.label_studio_api import (
    main as ls_main,
)
from searchrl.validation.overrides import load_overrides
from tests.conftest import REPO_ROOT
from tests.contracts.conftest import DEFECTS
from tests.helpers import stop_process_group

pytestmark = pytest.mark.slow
LABEL_STUDIO = REPO_ROOT / ".venv-steward" / "bin" / "label-studio"
REQUIRE_ENV = "SEARCHRL_REQUIRE_LABEL_STUDIO"
ADMIN, ADMIN_PW = "lead@example.com", "lead-pass-123"
ANA, ANA_PW = "ana@example.com", "ana-pass-123"
BO, BO_PW = "bo@example.com", "bo-pass-123"
PROJECT = "searchrl audit (test)"
START_TIMEOUT_S = 300  # migrations on a fresh sqlite database: about a minute on 2 busy cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def label_studio(data_dir: Path) -> Iterator[str]:
    """A Label Studio server on a free port with its data under `data_dir`; its URL."""
    if not LABEL_STUDIO.is_file():
        # CI builds the steward venv before this test: there a missing binary is a failure.
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{LABEL_STUDIO} is missing and {REQUIRE_ENV}=1: make steward-env")
        pytest.skip("Label Studio is not installed: make steward-env")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABEL_STUDIO_")}
    env |= {"LABEL_STUDIO_BASE_DATA_DIR": str(data_dir), "DJANGO_DB": "sqlite",
            "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "true"}
    log = data_dir.parent / "label_studio.log"
    data_dir.mkdir(parents=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(LABEL_STUDIO), "start", "--no-browser", "--port", str(port), "--host", url,
             "--username", ADMIN, "--password", ADMIN_PW],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not up in {START_TIMEOUT_S} s"
            time.sleep(1)
        yield url
    finally:
        alive = stop_process_group(proc)
        assert not alive, f"Label Studio left processes behind: {alive}"


def _browser(url: str, email: str, password: str, *, invite: str | None = None
             ) -> httpx.Client:
    """A steward's browser session: the sign-in (or invite sign-up) form, then the API calls
    the web app makes, with the session cookie and the CSRF header."""
    client = httpx.Client(base_url=url, timeout=120)
    page = invite or "/user/login"
    client.get(page)
    form = {"email": email, "password": password,
            "csrfmiddlewaretoken": client.cookies["csrftoken"]}
    signed_in = client.post(page, data=form, headers={"Referer": url + page})
    assert signed_in.status_code == 302, signed_in.text[:500]
    client.headers.update({"X-CSRFToken": client.cookies["csrftoken"], "Referer": url})
    return client


def _choice(name: str, value: str) -> dict[str, Any]:
    return {"from_name": name, "to_name": "question", "type": "choices",
            "value": {"choices": [value]}}


def _text(name: str, value: str) -> dict[str, Any]:
    return {"from_name": name, "to_name": "question", "type": "textarea",
            "value": {"text": [value]}}


def _suspects() -> list[dict[str, Any]]:
    """Audit rows for two rows of the planted-defect world's train split."""
    corpus = {p["id"]: p["contents"] for p in
              map(json.loads, (DEFECTS / "corpus.jsonl").read_text().splitlines())}
    rows = [{"example_id": "t1", "question": "What is the capital of France?",
             "golden_answers": ["Paris"], "answer": "the capital of France",
             "answer_doc": "p1", "answer_snippet": corpus["p1"]},
            {"example_id": "t2", "question": "In which year was the Treaty of Versailles signed?",
             "golden_answers": ["1919", "1919."], "answer": "1919",
             "answer_doc": "p2", "answer_snippet": corpus["p2"]}]
    rows = [{**r, "tier": GOLD_LIKELY_WRONG, "confidence": 0.9, "gold_doc": None,
             "gold_snippet": ""} for r in rows]
    return pool_suspects(rows, {"t1": 1, "t2": 1}, split="train")


def test_label_studio_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    suspects = tmp_path / "eval" / "suspect_labels.jsonl"
    suspects.parent.mkdir()
    write_label_studio(suspects, _suspects())
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text("[]\n")
    config = tmp_path / "config.yaml"  # the planted-defect world, with the overrides file
    config.write_text(yaml.safe_dump({
        "run": {"name": "stewards", "work_dir": str(tmp_path / "run")},
        "data": {"source": "files", **{f"{s}_path": str(DEFECTS / f"{s}.jsonl")
                                       for s in ("train", "dev", "test", "corpus")}},
        "validate": {"max_quarantine_fraction": 1.0, "overrides_path": str(overrides),
                     "contracts_dir": str(REPO_ROOT / "data_contracts")}}))
    config_args = ["--config", str(config)]
    assert main(["validate", *config_args]) == 0  # this week's gold set
    before = json.loads(capsys.readouterr().out)
    export = tmp_path / "export.json"

    with label_studio(tmp_path / "ls") as url:
        lead = _browser(url, ADMIN, ADMIN_PW)
        made = lead.post("/api/token/")  # a personal access token, as the lead makes one
        assert made.status_code == 201, made.text
        monkeypatch.setenv(URL_ENV, url)
        monkeypatch.setenv(KEY_ENV, made.json()["token"])
        for _ in range(2):  # pushing twice imports once
            assert ls_main(["push", "--suspects", str(suspects), "--project", PROJECT]) == 0
        pushes = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [p["imported"] for p in pushes] == [2, 0]
        project = pushes[0]["project"]
        validation = tmp_path / "run" / "validate_gold_labels"  # validation's suspects too
        assert ls_main(["push", "--validation", str(validation), "--project", PROJECT]) == 0
        # train/t2 (flagged: '1919' and '1919.' are one answer) is held already: not twice
        assert json.loads(capsys.readouterr().out)["imported"] == 3
        label_config = lead.get(f"/api/projects/{project}").json()["label_config"]
        assert '<Text name="evidence" value="$evidence"/>' in label_config

        invite = lead.get("/api/invite").json()["invite_url"]
        ana = LabelStudio(_browser(url, ANA, ANA_PW, invite=invite))
        bo = LabelStudio(_browser(url, BO, BO_PW, invite=invite))
        tasks = {t["data"]["key"]: t for t in ana.tasks(project)}
        assert set(tasks) == {"train/t1", "train/t2", "train/t10", "train/t12", "test/e3"}
        assert "Paris is the capital of France." in tasks["train/t1"]["data"]["evidence"]
        assert "in none of the supporting passages" in tasks["train/t10"]["data"]["evidence"]
        # t1: both correct it the same way (Ana first chose accept, then changed her mind)
        ana.annotate(tasks["train/t1"]["id"], [_choice("decision", "accept")])
        first = {a["id"] for a in ana.client.get(
            f"/api/tasks/{tasks['train/t1']['id']}/annotations/").json()}
        (mine,) = first
        fixed = [_choice("decision", "correct"), _text("corrected_answers", "Paris\nParis, France"),
                 _text("reason", "both name the city; the passage says Paris")]
        changed = ana.client.patch(f"/api/annotations/{mine}/", json={"result": fixed})
        assert changed.status_code == 200, changed.text
        bo.annotate(tasks["train/t1"]["id"], fixed)
        # t2: they disagree
        ana.annotate(tasks["train/t2"]["id"], [_choice("decision", "accept")])
        bo.annotate(tasks["train/t2"]["id"], [_choice("decision", "correct"),
                                              _text("corrected_answers", "1919")])
        # t10 (validation's): the gold is right, the supporting passage ids are not
        bo.annotate(tasks["train/t10"]["id"], [_choice("decision", "accept"),
                                               _text("reason", "p5 says so")])
        assert ls_main(["pull", "--project", PROJECT, "--out", str(export)]) == 0
        capsys.readouterr()

    assert main(["apply-audit", "--decisions", str(export), *config_args]) == 1  # a conflict
    merged = json.loads(capsys.readouterr().out)
    assert merged["added"] == ["t1", "t10"] and merged["undecided"] == 2
    (conflict,) = merged["conflicts"]
    assert conflict.startswith("train/t2: stewards disagree in Label Studio")
    assert f"{ANA} (" in conflict and f"{BO} (" in conflict and "correct ['1919']" in conflict
    t1, t10 = load_overrides(overrides)  # the audit trail a steward shows a reviewer
    assert (t10.id, t10.action, t10.steward, t10.reason) == ("t10", "accept", BO, "p5 says so")
    assert (t1.action, t1.golden_answers) == ("correct", ("Paris", "Paris, France"))
    assert t1.steward == f"{ANA}, {BO}" and t1.reason.startswith("both name the city")
    assert t1.decided_at is not None and t1.decided_at.startswith(time.strftime("%Y-"))
    assert t1.source is not None and t1.source.startswith(f"label-studio:project {project}/")

    assert main(["validate", *config_args]) == 0  # the next run's validation
    after = json.loads(capsys.readouterr().out)
    train = {r.id: r for r in read_qa(Path(after["paths"]["train"]))}
    assert train["t1"].golden_answers == ("Paris", "Paris, France")
    assert train["t2"].golden_answers == ("1919", "1919.")  # the conflict changed nothing
    assert after["fingerprints"]["train"] != before["fingerprints"]["train"]
