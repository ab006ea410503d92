"""Rollback that converges (searchrl/tracking.py `rollback`), on a real MLflow sqlite store:
the store failing at any step of a rollback (fault injection: the k-th registry write raises)
leaves a state that the next call, plain or `--to`, finishes into exactly the uninterrupted
end state, with the old champion marked rolled back (so its weights are not promoted again);
events in the same second are ordered by state, not by timestamps; a restored version whose
predecessor retention deleted is restored cleanly, with no previous-champion."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient

from searchrl.__main__ import main as cli
from searchrl.tracking import (
    INTENT_TAG,
    PREVIOUS,
    RegistryError,
    TrackingError,
    model_version_tags,
    promote,
    registered_policy,
    rollback,
    was_rolled_back,
)
from tests.helpers import fresh_mlflow_uri, registry_fails_at

NAME = "m"


def _promoted(directory: Path, versions: int = 3) -> str:
    """A store where versions 1..`versions` were each promoted in turn: champion the last,
    previous-champion the one before (each version's predecessor on its tag)."""
    uri = fresh_mlflow_uri(directory)
    client = MlflowClient(tracking_uri=uri)
    client.create_registered_model(NAME)
    for n in range(1, versions + 1):
        client.create_model_version(NAME, (directory / f"policy{n}").as_uri())
        promote(uri, NAME, str(n))
    return uri


def _copy(uri: str, directory: Path) -> str:
    directory.mkdir()
    shutil.copyfile(uri.removeprefix("sqlite:///"), directory / "mlflow.db")
    return f"sqlite:///{directory / 'mlflow.db'}"


_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def _end_state(uri: str) -> dict[str, Any]:
    """Aliases, the model's tags and every version's tags, times blanked."""
    client = MlflowClient(tracking_uri=uri)
    model = client.get_registered_model(NAME)
    return {"aliases": {k: str(v) for k, v in model.aliases.items()},
            "model": {k: _TIME.sub("T", v) for k, v in model.tags.items()},
            "versions": {str(v.version): {k: _TIME.sub("T", x) for k, x in v.tags.items()}
                         for v in client.search_model_versions(f"name = '{NAME}'")}}


@pytest.mark.parametrize("retry", ["plain", "to"])
def test_a_rollback_interrupted_at_any_step_is_finished_by_the_retry(
        tmp_path: Path, retry: str) -> None:
    base = _promoted(tmp_path / "base")  # champion 3, previous-champion 2 (whose is 1)
    reference = _copy(base, tmp_path / "reference")
    with registry_fails_at(0) as writes:  # never fails: counts the steps
        rollback(reference, NAME, "bad answers")
    expected = _end_state(reference)
    assert expected["aliases"] == {"champion": "2", PREVIOUS: "1"}
    assert was_rolled_back(model_version_tags(reference, NAME, "3"))
    assert len(writes) >= 5
    for k in range(1, len(writes) + 1):
        uri = _copy(base, tmp_path / f"fails-at-{k}")
        with registry_fails_at(k), pytest.raises(TrackingError, match=r"re-run .*rollback"):
            rollback(uri, NAME, "bad answers")
        if k > 1:  # the intent is recorded: nothing moves the champion under it
            with pytest.raises(RegistryError, match="did not finish"):
                promote(uri, NAME, "1")
        done = rollback(uri, NAME, "bad answers", to_version="2" if retry == "to" else None)
        assert (done["from_version"], done["to_version"]) == ("3", "2"), k
        assert _end_state(uri) == expected, f"interrupted at write {k}: {writes[k - 1]}"
        # The old champion is marked: a GO with its weights is not promoted again.
        assert was_rolled_back(model_version_tags(uri, NAME, "3")), k
    # Done: retries change nothing.
    assert rollback(uri, NAME, "bad answers", to_version="2")["already"] == "true"
    with pytest.raises(RegistryError, match="restored by a rollback"):
        rollback(uri, NAME, "bad answers")
    assert _end_state(uri) == expected


def test_a_rollback_and_a_to_in_the_same_second_are_ordered(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = _promoted(tmp_path)
    second = time.gmtime()
    monkeypatch.setattr(time, "gmtime", lambda *_: second)  # every event in one second
    rollback(uri, NAME, "bad answers")  # champion 3 -> 2
    rollback(uri, NAME, "it was the retriever", to_version="3")  # and back
    assert registered_policy(uri, NAME, "champion")["version"] == "3"  # type: ignore[index]
    assert was_rolled_back(model_version_tags(uri, NAME, "2"))
    assert not was_rolled_back(model_version_tags(uri, NAME, "3"))


def test_a_rollback_whose_predecessor_retention_deleted_leaves_no_previous_champion(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = _promoted(tmp_path)  # champion 3, previous 2, whose predecessor is 1
    MlflowClient(tracking_uri=uri).delete_model_version(NAME, "1")  # unaliased: retention's
    cfg = ["--config", "configs/tiny.yaml", "run.name=x", "eval.registry_model_name=m",
           f"tracking.tracking_uri={uri}"]
    assert cli(["rollback", *cfg, "--reason", "bad answers"]) == 0
    assert "version 1, is no longer in the registry" in capsys.readouterr().out
    assert registered_policy(uri, NAME, "champion")["version"] == "2"  # type: ignore[index]
    assert registered_policy(uri, NAME, PREVIOUS) is None  # not the champion itself
    assert INTENT_TAG not in MlflowClient(tracking_uri=uri).get_registered_model(NAME).tags
