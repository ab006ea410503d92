"""Exit codes of `python -m searchrl` and `flows/pipeline.py`: an expected error prints its
message alone (the message names file, key or stage and the fix) and exits with its class's
code; anything else is a bug, printed with its traceback, exit 70.

Errors are matched by class name (the class or a base, defined in a `searchrl` module), so a
class moving between modules keeps its code and importing this module loads nothing heavy.
"""

from __future__ import annotations

import signal
import sys
import traceback
from dataclasses import dataclass


@dataclass(frozen=True)
class ExitCode:
    code: int
    meaning: str
    errors: tuple[str, ...] = ()  # exception class names


BUG = 70  # sysexits EX_SOFTWARE: never 1, which a scheduler reads as the gate's NO-GO

EXIT_CODES: tuple[ExitCode, ...] = (
    ExitCode(0, "success (gate: GO)"),
    ExitCode(1, "the answer is no: gate NO-GO, or apply-audit found conflicting decisions"),
    ExitCode(2, "usage or configuration: a bad option, config key or value", ("ConfigError",)),
    ExitCode(3, "a stage's input is missing or stale (or in another release's format): run "
                "the stage it names first", ("StageInputError", "EvalResultsError")),
    ExitCode(4, "an input file is missing or unreadable (data, overrides, demos, encoder)",
             ("DataError", "OverridesError", "DemoError", "EncoderError")),
    ExitCode(5, "data breaks its contract (a corpus, or a contract suite module)",
             ("ContractError",)),
    ExitCode(6, "too many rows quarantined (validate.max_quarantine_fraction): see the audit "
                "report", ("QuarantineThresholdError",)),
    ExitCode(7, "a service refused or is unreachable (retrieval service, search, tracking "
                "store, frontier endpoint, the Ray cluster of engine.address), or too many of "
                "a stage's searches failed",
             ("ServiceError", "SearchError", "TrackingError", "EndpointError",
              "RetrieverFailedError", "EngineError")),
    ExitCode(8, "an artifact on disk is incomplete or does not match (checkpoint, index)",
             ("CheckpointError", "IndexStoreError")),
    ExitCode(9, "training failed (ranks, DeepSpeed setup, non-finite steps)",
             ("TrainingError", "LaunchError", "DeepSpeedSetupError", "HostfileError")),
    ExitCode(10, "the gate refused its input: the evaluation saw failed searches (fix the "
                 "retriever, re-run evaluate_policy)", ("GateInputError",)),
    ExitCode(11, "the model registry has no version to act on (rollback without a "
                 "previous-champion or a reason, a plain rollback of a champion a rollback "
                 "restored, a version in a policy format this release does not read)",
             ("RegistryError",)),
    ExitCode(12, "another process holds what this command changes (a stage dir, the "
                 "overrides file): the message names it; wait for it or stop it, then re-run",
             ("BusyError",)),
    ExitCode(BUG, "a bug: the traceback is printed"),
    ExitCode(143, "stopped by SIGTERM (128 + 15): the flow run is Crashed, its MLflow run "
                  "FAILED; a re-run resumes from the completed stages and checkpoints"),
)

_BY_NAME = {name: e.code for e in EXIT_CODES for name in e.errors}


def exit_code_of(exc: BaseException) -> int | None:
    """The code of an expected error (its class or the nearest base in the table), else None."""
    for cls in type(exc).__mro__:
        if cls.__module__.startswith("searchrl") and cls.__name__ in _BY_NAME:
            return _BY_NAME[cls.__name__]
    return None


def report_error(exc: Exception) -> int:
    """Print an expected error's message alone, a bug's traceback; return the exit code."""
    code = exit_code_of(exc)
    if code is None:
        traceback.print_exception(exc)
        print(f"(exit {BUG}: an unexpected error, a bug; please report it with the traceback)",
              file=sys.stderr)
        return BUG
    print(str(exc) or type(exc).__name__, file=sys.stderr)
    return code


def exit_code_table() -> str:
    """The codes as `--help` shows them."""
    return "exit codes:\n" + "\n".join(f"  {e.code:>3}  {e.meaning}" for e in EXIT_CODES)


def exit_on_sigterm() -> None:
    """SIGTERM (a scheduler's timeout, `kill`) raises SystemExit(143): the process unwinds
    through its `finally` blocks and exit handlers (a child server or flow it started is
    stopped), where Python's default would end it without them."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
