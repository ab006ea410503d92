"""Every mistake a user can type, as one table: the command (`python -m searchrl`, the flow
script, the retrieval server), the exit code it must end with (`searchrl.exit_codes`, the
README's table), a fragment of its message (naming the file, and the line, task or field
where there is one), no traceback, and nothing written: no file under the test's directory
appears or changes (the inputs included), so nothing is left half-written or marked
complete. All run in-process.

Config override parsing (values, keys, quoting) has its own tests (tests/unit/test_config.py);
the retrieval service's HTTP answers theirs (tests/unit/test_retrieval_service.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from searchrl.__main__ import main as cli

ROOT = Path(__file__).resolve().parents[2]
QA = ROOT / "data/hotpotqa_train100/questions.jsonl"
CORPUS = ROOT / "data/hotpotqa_train100/corpus.jsonl"
SMALL_WORLD = ["data.synthetic.n_people=40", "data.synthetic.n_organisations=10"]
NOT_UTF8 = b"caf\xe9"  # Latin-1, as a spreadsheet on Windows saves it


def _flow(argv: list[str]) -> int:
    from flows.pipeline import main

    return main(argv)


def _server(argv: list[str]) -> int:
    from searchrl.retrieval.server import main

    return main(argv)


@dataclass(frozen=True)
class Mistake:
    name: str
    argv: Callable[[Path], list[str]]  # the command line, given the test's directory
    code: int
    says: str  # a fragment of the message ({tmp}: the test's directory)
    run: Callable[[list[str]], int] = cli
    before: Callable[[Path], None] | None = None  # state the mistake is made in
    # A stage directory the failed stage may leave scratch files in (never its ref.json,
    # which marks a stage complete): a bad line deep in a wiki-scale corpus is found while
    # it streams, after the QA sets were copied.
    scratch: str | None = None
    marks: tuple[pytest.MarkDecorator, ...] = field(default=())


def _files(tmp: Path) -> list[str]:
    """Data files from the files the mistakes read: good ones, and each kind of bad one."""
    return ["data.source=files", f"data.train_path={QA}", f"data.test_path={QA}",
            f"data.corpus_path={CORPUS}", f"run.work_dir={tmp / 'work'}"]


def _audit(tmp: Path, decisions: str, overrides: str = "overrides.yaml") -> list[str]:
    return ["apply-audit", "--decisions", str(tmp / decisions),
            f"validate.overrides_path={tmp / overrides}", f"run.work_dir={tmp / 'work'}"]


def _validated_small_world(tmp: Path) -> None:
    work = [*SMALL_WORLD, f"run.work_dir={tmp / 'work'}"]
    assert cli(["generate-world", *work]) == 0
    assert cli(["validate", *work]) == 0


def _taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


TASK = {"id": 7, "data": {"key": "test:q1", "split": "test", "example_id": "q1"}}
INPUTS: dict[str, bytes] = {
    "latin1.yaml": b"run:\n  name: " + NOT_UTF8 + b"\n",
    "list.yaml": b"- run\n- data\n",
    "qa_latin1.jsonl": b'{"id": "1", "question": "' + NOT_UTF8 + b'?", "golden_answers": ["x"]}\n',
    "corpus_latin1.jsonl": b'{"id": "d1", "contents": "' + NOT_UTF8 + b'"}\n',
    "overrides.yaml": b"# decisions so far\n[]\n",
    "overrides_latin1.yaml": b"- id: q1\n  reason: " + NOT_UTF8 + b"\n",
    "decisions_latin1.jsonl": b'{"key": "test:q1", "reason": "' + NOT_UTF8 + b'"}\n',
    "decisions_not_rows.json": json.dumps({"tasks": [TASK]}).encode(),
    "export_latin1.json": b'[{"id": 1, "data": {"key": "' + NOT_UTF8 + b'"}}]',
    "export_truncated.json": b'[{"id": 1, "data": {',
    "export_ints.json": b"[1, 2]",
    "export_annotations_dict.json": json.dumps([{**TASK, "annotations": {"result": []}}]).encode(),
    "export_result_text.json": json.dumps([{**TASK, "annotations": [{"result": "accept"}]}]
                                          ).encode(),
    "export_value_list.json": json.dumps([{**TASK, "annotations": [{"result": [
        {"from_name": "decision", "value": ["accept"]}]}]}]).encode(),
    "spec_latin1.yaml": b"name: " + NOT_UTF8 + b"\n",
    "a_file": b"not a directory\n",
}

ROOT_CAN_READ_ANYTHING = pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                                            reason="root reads a file without permissions")

MISTAKES = [
    # --- the config file (its overrides: tests/unit/test_config.py)
    Mistake("config missing", lambda t: ["config", "--config", str(t / "nope.yaml")],
            2, "{tmp}/nope.yaml: config file not found"),
    Mistake("config not UTF-8", lambda t: ["config", "--config", str(t / "latin1.yaml")],
            2, "{tmp}/latin1.yaml: cannot be read as UTF-8 text"),
    Mistake("config not a mapping", lambda t: ["config", "--config", str(t / "list.yaml")],
            2, "{tmp}/list.yaml: top level must be a mapping of sections"),
    Mistake("unknown command", lambda t: ["frobnicate"], 2, "invalid choice: 'frobnicate'"),
    # --- gold files and corpora (validate)
    Mistake("gold file missing",
            lambda t: ["validate", *_files(t), f"data.train_path={t / 'nope.jsonl'}"],
            4, "{tmp}/nope.jsonl: file not found"),
    Mistake("gold file is a directory",
            lambda t: ["validate", *_files(t), f"data.train_path={t / 'work'}"],
            4, "{tmp}/work: not a `datasets` save_to_disk directory"),
    Mistake("gold file not UTF-8",
            lambda t: ["validate", *_files(t), f"data.train_path={t / 'qa_latin1.jsonl'}"],
            4, "{tmp}/qa_latin1.jsonl: not JSONL: none of its 1 lines is a JSON object (line 1: "
               "not valid UTF-8 at byte 28)"),
    Mistake("corpus not UTF-8",
            lambda t: ["validate", *_files(t), f"data.corpus_path={t / 'corpus_latin1.jsonl'}"],
            4, "{tmp}/corpus_latin1.jsonl:1: not valid UTF-8 at byte 29",
            scratch="work/validate_gold_labels"),
    Mistake("corpus missing",
            lambda t: ["validate", *_files(t), f"data.corpus_path={t / 'nope.jsonl'}"],
            4, "{tmp}/nope.jsonl: file not found (data.corpus_path)"),
    # --- the stewards' overrides file (validate.overrides_path)
    Mistake("overrides missing",
            lambda t: ["validate", *_files(t), f"validate.overrides_path={t / 'nope.yaml'}"],
            4, "{tmp}/nope.yaml: overrides file not found (validate.overrides_path)"),
    Mistake("overrides not UTF-8",
            lambda t: ["validate", *_files(t),
                       f"validate.overrides_path={t / 'overrides_latin1.yaml'}"],
            4, "{tmp}/overrides_latin1.yaml: line 2: the overrides file "
               "(validate.overrides_path) is not UTF-8 text"),
    Mistake("overrides unreadable",
            lambda t: ["validate", *_files(t), f"validate.overrides_path={t / 'locked.yaml'}"],
            4, "{tmp}/locked.yaml: cannot read the overrides file (validate.overrides_path): "
               "Permission denied",
            before=lambda t: (t / "locked.yaml").write_text("[]\n") or
            (t / "locked.yaml").chmod(0), marks=(ROOT_CAN_READ_ANYTHING,)),
    # --- audit decisions and Label Studio exports (apply-audit)
    Mistake("decisions missing", lambda t: _audit(t, "nope.jsonl"),
            2, "apply-audit needs --decisions FILE"),
    Mistake("decisions not UTF-8", lambda t: _audit(t, "decisions_latin1.jsonl"),
            4, "{tmp}/decisions_latin1.jsonl: line 1: the decisions file (--decisions) is not "
               "UTF-8 text"),
    Mistake("decisions not audit rows", lambda t: _audit(t, "decisions_not_rows.json"),
            4, "{tmp}/decisions_not_rows.json: line 1: field 'key' is missing"),
    Mistake("overrides to merge into not UTF-8",
            lambda t: _audit(t, "export_ints.json", "overrides_latin1.yaml"),
            4, "{tmp}/overrides_latin1.yaml: line 2: the overrides file"),
    Mistake("overrides_path null",
            lambda t: [*_audit(t, "decisions_latin1.jsonl"), "validate.overrides_path=null"],
            2, "validate.overrides_path is null"),
    Mistake("export not UTF-8", lambda t: _audit(t, "export_latin1.json"),
            4, "{tmp}/export_latin1.json: line 1: the Label Studio export is not UTF-8 text"),
    Mistake("export truncated", lambda t: _audit(t, "export_truncated.json"),
            4, "{tmp}/export_truncated.json: not valid JSON"),
    Mistake("export not tasks", lambda t: _audit(t, "export_ints.json"),
            4, "{tmp}/export_ints.json: task 1: field 'data' is missing"),
    Mistake("export annotations not a list", lambda t: _audit(t, "export_annotations_dict.json"),
            4, "task 7: field 'annotations': expected a list, got dict"),
    Mistake("export result not a list", lambda t: _audit(t, "export_result_text.json"),
            4, "task 7: field 'annotations[0].result': expected a list of objects"),
    Mistake("export value not an object", lambda t: _audit(t, "export_value_list.json"),
            4, "task 7: field 'annotations[0].result': field 'value' must be an object"),
    # --- real data (prepare-data) and worlds (generate-world)
    Mistake("prepare-data without a spec", lambda t: ["prepare-data", "--out", str(t / "p")],
            2, "prepare-data needs --spec SPEC.yaml and --out DIR"),
    Mistake("spec missing",
            lambda t: ["prepare-data", "--spec", str(t / "nope.yaml"), "--out", str(t / "p")],
            4, "{tmp}/nope.yaml: cannot read the prepare spec (--spec): No such file"),
    Mistake("spec not UTF-8",
            lambda t: ["prepare-data", "--spec", str(t / "spec_latin1.yaml"),
                       "--out", str(t / "p")],
            4, "{tmp}/spec_latin1.yaml: line 1: the prepare spec (--spec) is not UTF-8 text"),
    Mistake("--out is a file", lambda t: ["generate-world", "--out", str(t / "a_file")],
            2, "--out {tmp}/a_file: exists and is not a directory"),
    # --- run directories
    Mistake("stage before its input",
            lambda t: ["index", f"run.work_dir={t / 'work'}"],
            3, "run `python -m searchrl validate` first"),
    Mistake("run dir of another config",
            lambda t: ["index", "data.synthetic.n_people=41",
                       "data.synthetic.n_organisations=10", f"run.work_dir={t / 'work'}"],
            3, "{tmp}/work/validate_gold_labels was written by another config "
               "(data.synthetic.n_people is 40 there, 41 here)",
            before=_validated_small_world),
    # --- the registry and the tracking store
    Mistake("registry name that does not exist",
            lambda t: ["rollback", "--reason", "bad model", "eval.registry_model_name=nope",
                       f"tracking.tracking_uri=sqlite:///{t.parent / 'store.db'}"],
            11, "model 'nope' has no 'previous-champion' alias"),
    Mistake("rollback without a reason", lambda t: ["rollback"], 2, "rollback needs --reason"),
    Mistake("tracking store unreachable",
            lambda t: ["prune", "tracking.tracking_uri=http://127.0.0.1:9",
                       "tracking.connect_timeout_s=2"],
            7, "MLflow tracking server http://127.0.0.1:9 is unreachable"),
    # --- the flow script's parameters (the rest are the config's, above)
    Mistake("flow config missing", lambda t: ["--config", str(t / "nope.yaml")],
            2, "{tmp}/nope.yaml: config file not found", run=_flow),
    Mistake("flow config not UTF-8", lambda t: ["--config", str(t / "latin1.yaml")],
            2, "{tmp}/latin1.yaml: cannot be read as UTF-8 text", run=_flow),
    # --- the retrieval server
    Mistake("server index missing", lambda t: ["--index-dir", str(t / "nope")],
            8, "{tmp}/nope/main: no complete index here", run=_server),
    Mistake("server on a remote address without a token",
            lambda t: ["--index-dir", str(t / "nope"), "--host", "0.0.0.0"],
            2, "refusing to serve on 0.0.0.0 without a token", run=_server),
]


def _snapshot(tmp: Path, scratch: str | None = None) -> dict[str, str]:
    """Every file under `tmp` (its content's hash; "unreadable" for one without permissions),
    so a mistake that writes, truncates or marks anything complete shows. Not counted: the
    empty lock files the overrides file's lock leaves (searchrl.locks), and files under
    `scratch` other than a ref.json."""
    out = {}
    for path in sorted(tmp.rglob("*")):
        if path.suffix == ".lock" and path.stat().st_size == 0:
            continue
        if (scratch is not None and path.is_relative_to(tmp / scratch)
                and path.name != "ref.json"):
            continue
        if path.is_file():
            try:
                out[str(path.relative_to(tmp))] = hashlib.sha256(path.read_bytes()).hexdigest()
            except PermissionError:
                out[str(path.relative_to(tmp))] = "unreadable"
    return out


@pytest.mark.parametrize("mistake", [pytest.param(m, id=m.name, marks=m.marks)
                                     for m in MISTAKES])
def test_a_users_mistake_exits_with_its_code_and_message_and_writes_nothing(
        mistake: Mistake, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    tmp = tmp_path / "user"
    (tmp / "work").mkdir(parents=True)
    for name, content in INPUTS.items():
        (tmp / name).write_bytes(content)
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    if mistake.before is not None:
        mistake.before(tmp)
    before = _snapshot(tmp, mistake.scratch)
    capsys.readouterr()
    try:
        code = mistake.run([str(a) for a in mistake.argv(tmp)])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert code == mistake.code, err
    assert mistake.says.format(tmp=tmp) in err, err
    assert _snapshot(tmp, mistake.scratch) == before


def test_the_server_refuses_a_taken_port_before_loading_the_index(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The port is checked first: the index (here missing) would take minutes to load."""
    for port in _taken_port():
        code = _server(["--index-dir", str(tmp_path / "nope"), "--port", str(port)])
        err = capsys.readouterr().err
        assert code == 7 and f"cannot serve the retriever on 127.0.0.1:{port}" in err, err
        assert "Traceback" not in err and "index.service_port" in err
