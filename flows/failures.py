"""What a failed stage means to the pipeline flow (flows/pipeline.py): which failures are retried, the stage's own
exit code read from DVC's output, and stopping the running stages when the flow is interrupted."""

import contextlib
import os
import re
import signal

from prefect.states import State

from scalelab.runtime import placement

DEFAULT_RETRIES = 2  # every stage is idempotent: training resumes from its checkpoint
# Stage-name prefix -> retries. Data stages are deterministic: a retry would only repeat the same error.
RETRIES = {"validate": 0, "prepare": 0, "tokenize": 0}
# A stage's own exit codes for bad input (scalelab.pipeline.stage): the same params, data or hyperparameters fail the same way
# again, so a retry only delays the error (a data error once ran three times over ~19 minutes). Crashes (1, a
# signal) and lock contention stay retried. DVC reports the command's code as "failed to run: <cmd>, exited with N"
# (dvc.stage.exceptions.StageCmdFailedError) and itself exits 255: the task reads the stage's code from that line.
DETERMINISTIC = {2: "params error", 3: "data error", 4: "non-finite loss"}
STAGE_EXIT = re.compile(r"failed to run: .*, exited with (-?\d+)")
# DVC's own errors before the stage's command runs, which the same dvc.yaml, params.yaml and upstream outs repeat
# (DVC exits 255 for these and for a crash alike, so its message decides): a params key it cannot find (a model
# named `sigmascale-0.8`, read as a nested key, ran three times), a dependency no stage produced, a
# dvc.yaml that does not resolve. Read only from DVC's ERROR lines when no stage command ran (no "failed to run").
DVC_DETERMINISTIC = {
    "are missing from '": "params key DVC cannot find",  # dvc.dependency.param.MissingParamsError
    "Parameters file '": "params file DVC cannot find",  # MissingParamsFile
    "missing data '": "missing dependency",  # dvc.stage.exceptions.MissingDataSource
    "failed to parse '": "dvc.yaml error",  # dvc.parsing.ResolveError
}
# An interrupted flow (SIGTERM, Ctrl-C) stops its stages: Prefect cancels only tasks not yet started, and the thread
# pool runs every queued task before the process can exit, so without this the flow went on submitting cells.
# The state lives in scalelab.runtime.placement: Dask and Ray pickle this module's functions by value, and a lock cannot be.


def stop_stages() -> None:
    """No stage starts after this; each running one gets SIGTERM in its process group (DVC, the stage, and through
    scalelab.pipeline.warm a warm-started stage's child): training keeps its last checkpoint and DVC its locks' consistency."""
    placement.STOP.set()
    with placement.LIVE_LOCK:
        for proc in placement.LIVE:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)


class StageFailed(RuntimeError):
    """A stage's command failed with `code` (the stage's own exit status, else DVC's)."""

    def __init__(self, stage: str, code: int, tail: list[str]):
        self.stage, self.code, self.tail = stage, code, tail
        self.why = deterministic(code, tail)  # None: a crash or something else a retry may get past
        why = f" ({self.why}: deterministic, not retried)" if self.why else ""
        super().__init__(f"stage {stage} failed (exit {code}{why}):\n" + "\n".join(tail))

    def __reduce__(self):  # to Dask/Ray and back: the default would call __init__ with the message alone
        return type(self), (self.stage, self.code, self.tail)


def stage_exit(dvc_code: int, tail: list[str]) -> int:
    """The stage command's exit status from DVC's last "failed to run" line; DVC's own when it names none (a DVC
    error, not the stage's)."""
    codes = [int(m.group(1)) for line in tail if (m := STAGE_EXIT.search(line))]
    return codes[-1] if codes else dvc_code


def deterministic(code: int, tail: list[str]) -> str | None:
    """What makes a failure one a retry repeats (the stage's own code, DETERMINISTIC; else DVC's error before the
    command ran, DVC_DETERMINISTIC), or None."""
    if code in DETERMINISTIC:
        return DETERMINISTIC[code]
    if any(STAGE_EXIT.search(line) for line in tail):  # the command ran and failed otherwise: a crash, retried
        return None
    errors = [line for line in tail if line.startswith("ERROR:")]
    return next((why for line in errors for needle, why in DVC_DETERMINISTIC.items() if needle in line), None)


def retryable(task, task_run, state: State) -> bool:
    """Prefect's retry condition: anything but a deterministic failure (`deterministic`)."""
    exc = state.data if isinstance(state.data, BaseException) else None
    return not (isinstance(exc, StageFailed) and exc.why)


def retries_for(stage: str) -> int:
    return next((n for prefix, n in RETRIES.items() if stage.startswith(prefix)), DEFAULT_RETRIES)
