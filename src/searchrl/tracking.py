"""The one module that imports mlflow.

`MlflowSink` implements `searchrl.sinks.MetricsSink` (what stages and the trainer log to)
against one explicit run through `MlflowClient` (no global "active run", so Prefect task
threads and the trainer ranks cannot log into the wrong run).
One parent run per pipeline run, one child run per stage, the parent run id passed explicitly.

Over 400 lines because it is the one module that imports mlflow: runs, the registry, rollback and
retention's view of the store all go through it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from searchrl.datasets.io import publish_dir
from searchrl.sinks import MetricsSink, NullSink

PARENT_TAG = "mlflow.parentRunId"
# MLflow's per-request limits of `log_batch` (mlflow.utils.validation).
_BATCH_METRICS = 1000
_BATCH_PARAMS_TAGS = 100
STAGE_TAG = "searchrl.stage"

log = logging.getLogger(__name__)


_T = TypeVar("_T")


class TrackingError(RuntimeError):
    """The tracking store cannot be reached or used; raised before any expensive work starts."""


class MlflowSink:
    """Logs to one existing MLflow run by id."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.tracking_uri = tracking_uri
        self._run_id = run_id
        self.client = MlflowClient(tracking_uri=tracking_uri)

    @property
    def run_id(self) -> str:
        return self._run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        entries = [Param(key, str(value)[:6000]) for key, value in _flatten(params).items()]
        for chunk in _chunks(entries, _BATCH_PARAMS_TAGS):
            self.client.log_batch(self._run_id, params=chunk)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        # One request per batch, not per metric: against a SQLite store a metric logged alone
        # costs ~3.5 ms, a batch of 70 ~7 ms (the trainer logs ~70 metrics every step).
        now = int(time.time() * 1000)
        entries = [Metric(key, float(value), now, step or 0) for key, value in metrics.items()]
        for chunk in _chunks(entries, _BATCH_METRICS):
            self.client.log_batch(self._run_id, metrics=chunk)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        entries = [RunTag(key, str(value)) for key, value in tags.items()]
        for chunk in _chunks(entries, _BATCH_PARAMS_TAGS):
            self.client.log_batch(self._run_id, tags=chunk)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self.client.log_artifacts(self._run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(self._run_id, str(path), artifact_path)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self.client.log_dict(self._run_id, data, artifact_file)

    def end(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self._run_id, status=status)


def _chunks(items: list[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, prefix=f"{name}."))
        else:
            out[name] = value
    return out


# --- store resolution and fail-fast connectivity


def resolve_tracking_uri(configured: str | None, work_root: Path | None = None) -> str:
    """Configured URI, else $MLFLOW_TRACKING_URI, else a local sqlite file under the cwd."""
    if configured:
        return configured
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    root = (work_root or Path.cwd()).resolve()
    return f"sqlite:///{root / 'mlflow.db'}"


def _artifact_root(uri: str) -> str | None:
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


def check_tracking_store(uri: str, timeout_s: float = 10.0) -> None:
    """Raise TrackingError at once when an HTTP tracking server is unreachable."""
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as resp:
                if resp.status >= 400:
                    raise TrackingError(f"MLflow server {uri} answered {resp.status} on /health")
        except (urllib.error.URLError, OSError) as exc:
            raise TrackingError(
                f"MLflow tracking server {uri} is unreachable ({exc}); start it, fix "
                "MLFLOW_TRACKING_URI / tracking.tracking_uri, or unset it for a local store"
            ) from exc
    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except Exception as exc:  # mlflow raises many store-specific types
        raise TrackingError(f"MLflow store {uri} is not usable: {exc}") from exc


def _experiment_id(client: MlflowClient, uri: str, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    return str(client.create_experiment(name, artifact_location=_artifact_root(uri)))


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def start_parent_run(uri: str, experiment: str, run_name: str, config: Mapping[str, Any],
                     tags: Mapping[str, str] | None = None) -> MlflowSink:
    """Create the pipeline's parent run; log the resolved config and the git commit."""
    client = MlflowClient(tracking_uri=uri)
    exp_id = _experiment_id(client, uri, experiment)
    run = client.create_run(exp_id, run_name=run_name,
                            tags={"searchrl.git_commit": git_commit(), **(tags or {})})
    sink = MlflowSink(uri, run.info.run_id)
    sink.log_dict(dict(config), "config/resolved.json")
    return sink


def start_child_run(uri: str, parent_run_id: str, stage: str,
                    tags: Mapping[str, str] | None = None) -> MlflowSink:
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_run_id)
    run = client.create_run(
        parent.info.experiment_id, run_name=stage,
        tags={PARENT_TAG: parent_run_id, STAGE_TAG: stage,
              "searchrl.git_commit": git_commit(), **(tags or {})},
    )
    return MlflowSink(uri, run.info.run_id)


@contextmanager
def stage_run(uri: str | None, parent_run_id: str | None, stage: str,
              tags: Mapping[str, str] | None = None) -> Iterator[MetricsSink]:
    """A child run for one stage, marked FAILED if the stage raises; NullSink without a parent."""
    if uri is None or parent_run_id is None:
        yield NullSink()
        return
    sink = start_child_run(uri, parent_run_id, stage, tags)
    try:
        yield sink
    except BaseException:
        sink.end("FAILED")
        raise
    sink.end("FINISHED")


def end_run(uri: str, run_id: str, status: str = "FINISHED") -> None:
    MlflowClient(tracking_uri=uri).set_terminated(run_id, status=status)


def child_runs(uri: str, parent_run_id: str) -> list[dict[str, Any]]:
    """Stage name, status and metrics of a parent's child runs (for tests and reports)."""
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(parent_run_id)
    runs = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'")
    return [{"run_id": r.info.run_id, "stage": r.data.tags.get(STAGE_TAG),
             "status": r.info.status, "metrics": dict(r.data.metrics),
             "params": dict(r.data.params)} for r in runs]


# --- model registry (champion / challenger / previous-champion)

CHALLENGER = "challenger"
PREVIOUS = "previous-champion"
# On a version promoted to champion: the version it replaced, so a rollback can restore it
# and then knows what came before that.
PREVIOUS_TAG = "previous_champion_version"
_POLICY_ARTIFACT = "policy"
# Every version registered by this release says how its artifact is laid out, so a later
# release reads it, or refuses naming it, never misreads it. Versions without the tag were
# registered before the stamp: a save_pretrained dir or a transformers-flavor MLflow model,
# both of which `download_registered_policy` reads.
FORMAT_TAG = "searchrl.policy_format"
POLICY_FORMAT = 1  # a transformers-flavor MLflow model: model/ + components/tokenizer/
READABLE_POLICY_FORMATS = frozenset({1})
# The sha256 of the policy's weight files: a candidate with the weights of a registered
# version is that version, never registered again (`version_with_weights`).
WEIGHTS_TAG = "weights_sha256"


class RegistryError(RuntimeError):
    """The model registry holds no version to act on (e.g. rollback without a
    previous-champion); the message names the model and alias."""


def log_policy_model(uri: str, run_id: str, policy_dir: Path,
                     artifact_path: str = _POLICY_ARTIFACT) -> str:
    """Log the save_pretrained policy in `policy_dir` (model + tokenizer) as an MLflow model
    of the transformers flavor (text-generation) under the run's `artifact_path`, so that
    `mlflow.transformers.load_model("models:/<name>@<alias>")` loads it; return its URI."""
    import tempfile

    import mlflow.transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    client = MlflowClient(tracking_uri=uri)
    model = AutoModelForCausalLM.from_pretrained(str(policy_dir), dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(str(policy_dir))
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / artifact_path
        # pip_requirements=[]: inferring them imports and probes packages (slow, and it
        # may reach the network); the pipeline's environment is pinned elsewhere.
        mlflow.transformers.save_model({"model": model, "tokenizer": tokenizer}, str(saved),
                                       task="text-generation", pip_requirements=[])
        client.log_artifacts(run_id, str(saved), artifact_path)
    return f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{artifact_path}"


def logged_policy_model(uri: str, run_id: str) -> str | None:
    """The URI of the MLflow model `log_policy_model` logged under run `run_id` (the training
    stage's selected policy), None when that run logged none (an untracked training);
    TrackingError when the store does not answer."""
    client = MlflowClient(tracking_uri=uri)
    try:
        listed = {f.path for f in client.list_artifacts(run_id, _POLICY_ARTIFACT)}
        if f"{_POLICY_ARTIFACT}/MLmodel" not in listed:
            return None
        return f"{client.get_run(run_id).info.artifact_uri.rstrip('/')}/{_POLICY_ARTIFACT}"
    except mlflow.exceptions.MlflowException as exc:
        _raise_unless_absent(exc, f"run {run_id}: the store {uri} did not answer whether it "
                                  "logged a policy")
        return None


def weights_digest(policy_dir: Path) -> str:
    """sha256 over the policy's weight files (names and contents): equal exactly when two
    policies hold the same weights, whatever else their directories hold."""
    from searchrl.datasets.io import known_sha256

    files = sorted(p for p in Path(policy_dir).rglob("*")
                   if p.is_file() and p.suffix in {".safetensors", ".bin", ".pt"})
    if not files:
        raise RegistryError(f"{policy_dir}: no weight files (*.safetensors, *.bin): not a "
                            "saved policy")
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.relative_to(policy_dir)}={known_sha256(path)}\n".encode())
    return digest.hexdigest()


def register_policy(uri: str, run_id: str, policy_dir: Path, name: str, alias: str,
                    tags: Mapping[str, str] | None = None, *,
                    logged_model: str | None = None) -> str:
    """Register `policy_dir` as a new version of model `name` with `tags` (stamped with its
    format and weights digest), point `alias` at it; return the version. The version's
    artifact is `logged_model` (the MLflow model run `run_id` logged: the training run's,
    stored once), else `policy_dir` logged now as an MLflow transformers model under run
    `run_id`'s `policy/`."""
    client = MlflowClient(tracking_uri=uri)
    source = logged_model or log_policy_model(uri, run_id, policy_dir)
    try:
        client.get_registered_model(name)
    except mlflow.exceptions.MlflowException as exc:
        _raise_unless_absent(exc, f"model {name!r}: the registry of {uri} did not answer")
        client.create_registered_model(name)
    stamped = {**(tags or {}), FORMAT_TAG: str(POLICY_FORMAT),
               WEIGHTS_TAG: weights_digest(policy_dir)}
    version = client.create_model_version(name, source, run_id=run_id,
                                          tags={k: str(v)[:5000] for k, v in stamped.items()})
    client.set_registered_model_alias(name, alias, str(version.version))
    return str(version.version)


def set_version_tags(uri: str, name: str, version: str, tags: Mapping[str, str], *,
                     alias: str | None = None) -> None:
    """Tag an existing version (the latest gate's figures on a candidate already registered)
    and point `alias` at it, unless another alias holds it already: a re-run whose candidate
    is the champion leaves `challenger` on the newest other candidate (which would otherwise
    lose its alias, and retention's protection, to a version protected anyway)."""
    client = MlflowClient(tracking_uri=uri)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, str(value)[:5000])
    if alias is not None:
        others = {str(v) for a, v in client.get_registered_model(name).aliases.items()
                  if a != alias}
        if version not in others:
            client.set_registered_model_alias(name, alias, version)


def promote(uri: str, name: str, version: str, alias: str = "champion",
            previous_alias: str = PREVIOUS) -> str | None:
    """Point `alias` at `version`, keeping the version it replaces as `previous_alias` (and
    on the new version's `previous_champion_version` tag); return the replaced version.
    RegistryError while a rollback of `name` is unfinished (it would move the champion
    under it): finish the rollback first.

    Converges as `rollback` does: the intent (to, replaced, time) is written on the registered
    model first (PROMOTION_INTENT_TAG), then the new version is tagged, then the aliases move,
    then the intent is removed. A promotion the store interrupted (TrackingError) is finished
    by `finish_promotion`, which the next gate run, `promote` and `rollback` call first: the
    end state is the uninterrupted one's, and no version is left half-promoted (aliases moved
    without its record, or a `previous_alias` equal to the champion)."""
    client = MlflowClient(tracking_uri=uri)
    pending = _pending_rollback(client, name)
    if pending is not None:
        raise RegistryError(
            f"model {name!r}: a rollback to version {pending['to']} ({pending['reason']}) "
            f"started at {pending['at']} and did not finish; no promotion moves the champion "
            "under it: re-run `python -m searchrl rollback --reason TEXT` to finish it, then "
            "re-run the gate")
    _finish_promotion(client, name)
    current = _alias_version(client, name, alias)
    replaced = current if current is not None and current != version else None
    intent = {"to": version, "replaced": replaced or "", "alias": alias,
              "previous_alias": previous_alias, "at": _now()}
    _step(name, lambda: client.set_registered_model_tag(name, PROMOTION_INTENT_TAG,
                                                        json.dumps(intent)),
          "record the promotion's intent", kind="promotion")
    _carry_out_promotion(client, name, intent)
    return replaced


# On the registered model while a promotion is under way (JSON: to, replaced, alias,
# previous_alias, at), written before anything moves and removed when all is done.
PROMOTION_INTENT_TAG = "searchrl.promotion_intent"


def finish_promotion(uri: str, name: str) -> str | None:
    """Finish a promotion of `name` the store interrupted (its gate decided it); returns the
    version promoted, None when none was pending."""
    return _finish_promotion(MlflowClient(tracking_uri=uri), name)


def _finish_promotion(client: MlflowClient, name: str) -> str | None:
    raw = _model_tag(client, name, PROMOTION_INTENT_TAG)
    if not raw:
        return None
    intent = {k: str(v) for k, v in json.loads(raw).items()}
    if _version_tags(client, name, intent["to"]) is None:  # deleted since by hand
        log.warning("model %s: an unfinished promotion of version %s is dropped: that version "
                    "no longer exists", name, intent["to"])
        _step(name, lambda: client.delete_registered_model_tag(name, PROMOTION_INTENT_TAG),
              "drop the promotion's intent", kind="promotion")
        return None
    _carry_out_promotion(client, name, intent)
    return intent["to"]


def _carry_out_promotion(client: MlflowClient, name: str, intent: Mapping[str, str]) -> None:
    """The steps of the promotion `intent`, in order; each sets what it sets, so a repeat
    after an interruption changes nothing already done. The champion alias moves last but
    one: until then the registry reads as before the promotion."""
    to, replaced, alias = intent["to"], intent["replaced"], intent["alias"]
    steps: list[tuple[str, Any]] = []
    if replaced:
        steps.append((f"record version {replaced} as version {to}'s predecessor",
                      lambda: client.set_model_version_tag(name, to, PREVIOUS_TAG, replaced)))
    steps.append((f"mark version {to} promoted", lambda: _set_version_tags(
        client, name, to, {"promoted_at": intent["at"], STATE_TAG: PROMOTED})))
    if replaced:
        steps.append((f"point {intent['previous_alias']!r} at version {replaced}",
                      lambda: client.set_registered_model_alias(
                          name, intent["previous_alias"], replaced)))
    steps += [(f"point {alias!r} at version {to}",
               lambda: client.set_registered_model_alias(name, alias, to)),
              ("close the promotion",
               lambda: client.delete_registered_model_tag(name, PROMOTION_INTENT_TAG))]
    for what, step in steps:
        _step(name, step, what, kind="promotion")


# A version's latest registry event, written with the event: what `was_rolled_back` reads
# (timestamps written in the same second cannot order two events).
STATE_TAG = "searchrl.registry_state"
PROMOTED, RESTORED, ROLLED_BACK = "promoted", "restored", "rolled_back"
# On the registered model while a rollback is under way: what it will do (JSON: from, to,
# previous, reason, at), written before anything moves and removed when all is done, so a
# retry, plain or --to, finishes that same rollback (`rollback`).
INTENT_TAG = "searchrl.rollback_intent"


def _now() -> str:
    """UTC, to the millisecond (ISO 8601)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def rollback(uri: str, name: str, reason: str, alias: str = "champion",
             previous_alias: str = PREVIOUS, *, to_version: str | None = None
             ) -> dict[str, str]:
    """Point `alias` back at the `previous_alias` version (or at `to_version`) and record why
    (tags on both versions and on the registered model). The restored version's own
    predecessor becomes `previous_alias` (removed when it has none, or retention deleted it).

    A small state machine that converges: the intent (from, to, previous, reason, time) is
    written on the registered model first (INTENT_TAG), then the versions are tagged, then
    the aliases move, then the intent is removed. An interrupted rollback (the store failed
    at any step: TrackingError) is finished by the next call, plain or with `to_version`,
    with the first call's reason and time: the end state is the uninterrupted one's (a
    `to_version` other than the unfinished one's target is then rolled back to from there).

    Never one generation further by accident: with `to_version`, a retry finds the champion
    already there and changes nothing (`already: "true"`); without it, a champion that a
    rollback restored is not rolled back again (RegistryError: name the version). Raises
    RegistryError when there is nothing to roll back to."""
    if not reason.strip():
        raise RegistryError("rollback needs a reason (--reason TEXT): it is recorded on the "
                            "registry")
    client = MlflowClient(tracking_uri=uri)
    _finish_promotion(client, name)  # the champion rolled back from is the promoted one
    pending = _pending_rollback(client, name)
    if pending is not None and _version_tags(client, name, pending["to"]) is None:
        client.delete_registered_model_tag(name, INTENT_TAG)
        raise RegistryError(
            f"model {name!r}: an unfinished rollback to version {pending['to']} (started "
            f"{pending['at']}) cannot finish: that version was deleted since. Its record is "
            "dropped; check the aliases and roll back again (rollback --to VERSION)")
    if pending is not None:
        done = _carry_out(client, name, alias, previous_alias, pending) | {"resumed": "true"}
        if to_version is None or to_version == pending["to"]:
            return done
    intent = _plan_rollback(client, uri, name, reason, alias, previous_alias, to_version)
    if intent is None:
        to = str(to_version)
        return {"model": name, "from_version": to, "to_version": to, "reason": reason,
                "at": (_version_tags(client, name, to) or {}).get("restored_at", ""),
                "already": "true"}
    _step(name, lambda: client.set_registered_model_tag(name, INTENT_TAG, json.dumps(intent)))
    return _carry_out(client, name, alias, previous_alias, intent)


def _plan_rollback(client: MlflowClient, uri: str, name: str, reason: str, alias: str,
                   previous_alias: str, to_version: str | None) -> dict[str, str] | None:
    """The rollback's intent (every lookup done, nothing changed), None when `to_version` is
    the champion already."""
    current = _alias_version(client, name, alias)
    if to_version is not None:
        target = _version_tags(client, name, to_version)
        if target is None:
            raise RegistryError(f"model {name!r} in {uri} has no version {to_version}: "
                                "nothing to roll back to")
        _refuse_unreadable(name, to_version, target)
        if current == to_version:
            return None
    else:
        if current is not None:
            tags = _version_tags(client, name, current) or {}
            if _restored_last(tags):
                raise RegistryError(
                    f"model {name!r}: champion version {current} was itself restored by a "
                    f"rollback at {tags['restored_at']} ({tags.get('restored_reason', '')}); "
                    "another plain rollback would go one generation further: to do that, name "
                    "the version (rollback --to VERSION)")
        previous = _alias_version(client, name, previous_alias)
        if previous is None:
            raise RegistryError(f"model {name!r} has no {previous_alias!r} alias in {uri}: "
                                "nothing to roll back to (a previous champion is kept only "
                                "when a GO replaces one)")
        to_version = previous
        target = _version_tags(client, name, to_version) or {}
    earlier = target.get(PREVIOUS_TAG, "")
    note = ""
    if earlier and (earlier == to_version or _version_tags(client, name, earlier) is None):
        note = (f"its predecessor, version {earlier}, is no longer in the registry (retention "
                f"deletes unaliased versions): no {previous_alias!r} after this rollback")
        earlier = ""
    return {"from": current or "", "to": to_version, "previous": earlier, "reason": reason,
            "at": _now(), "note": note}


def _carry_out(client: MlflowClient, name: str, alias: str, previous_alias: str,
               intent: Mapping[str, str]) -> dict[str, str]:
    """The steps of the rollback `intent`, in order; each sets what it sets, so a repeat
    after an interruption changes nothing already done."""
    old, to, reason, when = intent["from"], intent["to"], intent["reason"], intent["at"]
    steps: list[tuple[str, Any]] = []
    if old:
        steps += [(f"mark version {old} rolled back", lambda: _set_version_tags(
            client, name, old, {"rolled_back_reason": reason, "rolled_back_at": when,
                                STATE_TAG: ROLLED_BACK}))]
    steps += [
        (f"mark version {to} restored", lambda: _set_version_tags(
            client, name, to, {"restored_reason": reason, "restored_at": when,
                               STATE_TAG: RESTORED})),
        (f"point {alias!r} at version {to}",
         lambda: client.set_registered_model_alias(name, alias, to)),
        (f"point {previous_alias!r} at version {intent['previous']}" if intent["previous"]
         else f"remove {previous_alias!r}",
         lambda: client.set_registered_model_alias(name, previous_alias, intent["previous"])
         if intent["previous"] else client.delete_registered_model_alias(name, previous_alias)),
        ("record it on the model", lambda: client.set_registered_model_tag(
            name, "last_rollback",
            f"{when}: version {old or '?'} -> {to}: {reason}"[:5000])),
        ("close the rollback", lambda: client.delete_registered_model_tag(name, INTENT_TAG)),
    ]
    for what, step in steps:
        _step(name, step, what)
    return {"model": name, "from_version": old, "to_version": to, "reason": reason,
            "at": when, "already": "false", "previous_version": intent["previous"],
            **({"note": intent["note"]} if intent.get("note") else {})}


# How to finish each kind of registry change the store interrupted.
_RETRY = {"rollback": "re-run `python -m searchrl rollback` (plain, or with the same --to) to "
                      "finish it",
          "promotion": "re-run the gate (the pipeline, or `python -m searchrl gate`): it "
                       "finishes this promotion before it decides"}


def _step(name: str, step: Any, what: str = "record the rollback's intent",
          kind: str = "rollback") -> None:
    try:
        step()
    except mlflow.exceptions.MlflowException as exc:
        raise TrackingError(
            f"model {name!r}: the {kind} stopped at '{what}' ({exc}); the registry records "
            f"what it was doing: {_RETRY[kind]}") from exc


def _set_version_tags(client: MlflowClient, name: str, version: str,
                      tags: Mapping[str, str]) -> None:
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value[:5000])


def _model_tag(client: MlflowClient, name: str, tag: str) -> str | None:
    """Tag `tag` of registered model `name` (None: no such tag or model); TrackingError when
    the registry does not answer."""
    try:
        return client.get_registered_model(name).tags.get(tag)  # type: ignore[no-any-return]
    except mlflow.exceptions.MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise TrackingError(f"model {name!r}: the registry did not answer ({exc})") from exc


def _pending_rollback(client: MlflowClient, name: str) -> dict[str, str] | None:
    """The intent of a rollback of `name` that started and did not finish, else None."""
    raw = _model_tag(client, name, INTENT_TAG)
    if not raw:
        return None
    intent = json.loads(raw)
    return {k: str(intent.get(k, "")) for k in ("from", "to", "previous", "reason", "at",
                                                "note")}


def _alias_version(client: MlflowClient, name: str, alias: str) -> str | None:
    """The version `alias` points at, None when the model or the alias does not exist;
    TrackingError when the registry fails to answer (never read as "no champion")."""
    mv = _aliased(client, name, alias)
    return None if mv is None else str(mv.version)


def _aliased(client: MlflowClient, name: str, alias: str) -> Any:
    """The ModelVersion `alias` points at (`_alias_version`'s rules)."""
    try:
        return client.get_model_version_by_alias(name, alias)
    except mlflow.exceptions.MlflowException as exc:
        _raise_unless_absent(exc, f"model {name!r}: the registry did not answer for alias "
                                  f"{alias!r}")
        return None


def _version_tags(client: MlflowClient, name: str, version: str) -> dict[str, str] | None:
    """The version's tags, None when it does not exist; TrackingError when the registry fails
    to answer (never read as "no such version")."""
    try:
        return dict(client.get_model_version(name, version).tags)
    except mlflow.exceptions.MlflowException as exc:
        _raise_unless_absent(exc, f"model {name!r}: the registry did not answer for version "
                                  f"{version}")
        return None


def _raise_unless_absent(exc: Exception, unanswered: str) -> None:
    """Returns when the registry said the thing does not exist; raises TrackingError
    (`unanswered`) for any other failure, so an unanswered lookup is never read as absent."""
    code = getattr(exc, "error_code", None)
    if code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
        return None
    raise TrackingError(f"{unanswered} ({exc})") from exc


def _restored_last(tags: Mapping[str, str]) -> bool:
    """The version's latest registry event is a rollback restoring it (not a promotion, not
    a rollback away from it)."""
    if STATE_TAG in tags:
        return tags[STATE_TAG] == RESTORED
    # Tagged before the state existed: by time (one-second resolution then).
    return bool(tags.get("restored_at")) and tags.get("restored_at", "") >= max(
        tags.get("rolled_back_at", ""), tags.get("promoted_at", ""))


def was_rolled_back(tags: Mapping[str, str]) -> bool:
    """The version's latest registry event is a rollback away from it."""
    if STATE_TAG in tags:
        return tags[STATE_TAG] == ROLLED_BACK
    return bool(tags.get("rolled_back_at")) and not _restored_last(tags)


def version_with_weights(uri: str, name: str, digest: str, policy_dir: Path | None = None
                         ) -> tuple[str, dict[str, str]] | None:
    """(version, tags) of the newest version of `name` registered with weights `digest`
    (WEIGHTS_TAG), None when none is (or the model does not exist); TrackingError when the
    registry does not answer (read as "none", the champion's weights would be registered again
    as a new version that no alias protects).

    With `policy_dir` (the candidate whose digest `digest` is): an aliased version registered
    before the tag existed (champion, previous-champion, challenger: the ones a re-run's
    decision turns on) is downloaded and compared tensor by tensor (its files were re-saved
    when it was logged, so their bytes may differ), and stamped with `digest` when equal: the
    first re-run after the upgrade does not register the champion again."""
    client = MlflowClient(tracking_uri=uri)
    try:  # a model that does not exist has no versions: [], not an error
        versions = client.search_model_versions(f"name = '{name}'")
    except mlflow.exceptions.MlflowException as exc:
        raise TrackingError(f"model {name!r}: the registry of {uri} did not answer which "
                            f"versions hold weights {digest[:12]} ({exc})") from exc
    stamped = {str(v.version): dict(v.tags) for v in versions if WEIGHTS_TAG in v.tags}
    unstamped = [v for v in versions if WEIGHTS_TAG not in v.tags]
    if (policy_dir is not None and unstamped
            and not any(t[WEIGHTS_TAG] == digest for t in stamped.values())):
        aliased = {str(v) for v in client.get_registered_model(name).aliases.values()}
        for mv in sorted(unstamped, key=lambda v: int(v.version), reverse=True):
            if str(mv.version) in aliased and _holds_weights(uri, name, mv, policy_dir):
                client.set_model_version_tag(name, str(mv.version), WEIGHTS_TAG, digest)
                stamped[str(mv.version)] = dict(mv.tags) | {WEIGHTS_TAG: digest}
                break
    same = [v for v, tags in stamped.items() if tags[WEIGHTS_TAG] == digest]
    if not same:
        return None
    newest = max(same, key=int)
    return newest, stamped[newest]


def _holds_weights(uri: str, name: str, mv: Any, policy_dir: Path) -> bool:
    """Whether registered version `mv` holds the tensors of `policy_dir` (False, with a
    warning, when it cannot be read)."""
    tmp = Path(tempfile.mkdtemp(prefix="searchrl-weights-"))
    try:
        got = download_policy_version(uri, name, {"version": str(mv.version), "run_id": str(
            mv.run_id or ""), "source": str(mv.source)}, tmp / "policy")
        return _same_tensors(got, Path(policy_dir))
    except (RegistryError, mlflow.exceptions.MlflowException, OSError) as exc:
        log.warning("model %s version %s: registered without %s and its weights could not be "
                    "read (%s): a candidate with its weights is registered as a new version",
                    name, mv.version, WEIGHTS_TAG, exc)
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _same_tensors(one: Path, other: Path) -> bool:
    """Equal tensor names, dtypes and values across the two directories' *.safetensors files
    (read one tensor at a time), whatever the files' names, metadata or layout."""
    import torch
    from safetensors import safe_open

    def tensors(root: Path) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for file in sorted(root.rglob("*.safetensors")):
            with safe_open(str(file), framework="pt") as handle:
                out |= dict.fromkeys(handle.keys(), file)
        return out

    ours, theirs = tensors(one), tensors(other)
    if not ours or ours.keys() != theirs.keys():
        return False
    for key in sorted(ours):
        with safe_open(str(ours[key]), framework="pt") as a, \
                safe_open(str(theirs[key]), framework="pt") as b:
            x, y = a.get_tensor(key), b.get_tensor(key)
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
            return False
    return True


def _refuse_unreadable(name: str, version: str, tags: Mapping[str, str]) -> None:
    """RegistryError when the version was registered in a layout this release cannot read."""
    stamp = tags.get(FORMAT_TAG)
    if stamp is None:
        return  # registered before the stamp: a layout `download_registered_policy` reads
    if not stamp.isdigit() or int(stamp) not in READABLE_POLICY_FORMATS:
        raise RegistryError(
            f"model {name!r} version {version}: policy format {stamp!r} ({FORMAT_TAG}), this "
            f"release reads {sorted(READABLE_POLICY_FORMATS)}: upgrade searchrl to the release "
            "that registered it, or point the alias at a version this release reads "
            "(rollback --to VERSION)")


def registered_policy(uri: str, name: str, alias: str) -> dict[str, str] | None:
    """The version `alias` points at (`version`, `run_id`, `source`), or None when the model
    or the alias does not exist (its tags: `model_version_tags`). TrackingError when the
    registry does not answer: read as "no champion", a store's hiccup would drop the champion
    from the evaluation and let the gate promote without comparing with it."""
    mv = _aliased(MlflowClient(tracking_uri=uri), name, alias)
    if mv is None:
        return None
    return {"version": str(mv.version), "run_id": str(mv.run_id or ""),
            "source": str(mv.source)}


def model_version_tags(uri: str, name: str, version: str) -> dict[str, str]:
    return dict(MlflowClient(tracking_uri=uri).get_model_version(name, version).tags)


def download_registered_policy(uri: str, name: str, alias: str, dst: Path) -> Path | None:
    """Download the policy `alias` points at into `dst` and return a save_pretrained
    directory of it (model + tokenizer); None when there is no such version."""
    found = registered_policy(uri, name, alias)
    return None if found is None else download_policy_version(uri, name, found, dst)


def download_policy_version(uri: str, name: str, found: Mapping[str, str], dst: Path) -> Path:
    """Download the version `found` (a `registered_policy` record) into `dst`; returns the
    save_pretrained directory of it. From the record itself, not a second lookup: an alias
    moved meanwhile never swaps the weights under the version recorded beside them."""
    _refuse_unreadable(name, found["version"],
                       _version_tags(MlflowClient(tracking_uri=uri), name, found["version"]) or {})
    # Into a fresh directory, published whole at `dst`: an earlier champion's files (another
    # layout, a tokenizer file this one lacks) never mix into this one.
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.new-", dir=dst.parent))
    try:
        got = Path(mlflow.artifacts.download_artifacts(
            artifact_uri=found["source"], dst_path=str(tmp), tracking_uri=uri))
        # Registered before policies were logged as MLflow models: the directory as is.
        if (got / "MLmodel").is_file():
            # The transformers flavor keeps the weights in model/ and the tokenizer in
            # components/tokenizer/: one directory is what the loaders here read.
            for file in sorted((got / "components" / "tokenizer").glob("*")):
                if file.is_file():
                    shutil.copy2(file, got / "model" / file.name)
            got = got / "model"
        inside = got.resolve().relative_to(tmp.resolve())
        publish_dir(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst / inside


# --- retention's view of the store (searchrl/retention.py decides what goes)


def registry_snapshot(uri: str) -> list[dict[str, Any]]:
    """Every version of every registered model in the store: name, version, run_id, source,
    tags and the aliases on it; newest first within a model.

    Retention decides what to delete from this, so it fails closed: a registry that does not
    answer raises TrackingError (an empty answer would protect nothing)."""
    client = MlflowClient(tracking_uri=uri)
    try:
        aliases: dict[tuple[str, str], list[str]] = {}
        for model in _all_pages(client.search_registered_models):
            for alias, version in model.aliases.items():
                aliases.setdefault((model.name, str(version)), []).append(alias)
        found = list(_all_pages(client.search_model_versions))
    except Exception as exc:  # mlflow raises many store-specific types
        raise TrackingError(
            f"the model registry of {uri} did not answer ({type(exc).__name__}: {exc}); "
            "retention deletes nothing without knowing which versions the aliases protect: "
            "fix the store, then re-run `python -m searchrl prune`") from exc
    return [{"name": str(mv.name), "version": str(mv.version), "run_id": mv.run_id,
             "source": str(mv.source), "tags": dict(mv.tags),
             "aliases": sorted(aliases.get((str(mv.name), str(mv.version)), []))}
            for mv in sorted(found, key=lambda v: (str(v.name), -int(v.version)))]


def _all_pages(search: Any) -> Iterator[Any]:
    """Every item of a paged MLflow search (`search(page_token=...)`)."""
    token = None
    while True:
        page = search(page_token=token)
        yield from page
        token = page.token
        if not token:
            return


def experiment_runs(uri: str, experiment: str) -> list[dict[str, Any]]:
    """Every run of `experiment`, newest first: id, name, status, start time (ms), parent run
    id (None for a parent) and artifact URI."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    found = _all_pages(lambda page_token: client.search_runs(
        [exp.experiment_id], max_results=50_000, order_by=["attributes.start_time DESC"],
        page_token=page_token))
    return [{"run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status,
             "start_time": r.info.start_time, "parent": r.data.tags.get(PARENT_TAG),
             "artifacts": r.info.artifact_uri} for r in found]


def delete_versions_and_runs(uri: str, versions: list[tuple[str, str]],
                             run_ids: list[str]) -> None:
    """Delete registered versions (name, version) and mark runs deleted (purged later by
    `mlflow gc`, retention's `_gc_runs`)."""
    client = MlflowClient(tracking_uri=uri)
    for name, version in versions:
        client.delete_model_version(name, version)
    for run_id in run_ids:
        client.delete_run(run_id)
