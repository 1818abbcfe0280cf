"""The Prefect flow that runs the DVC pipeline, one task per stage cell, independent cells concurrently.

    python flows/pipeline.py                                   # every stage; cells at once on this machine
    python flows/pipeline.py --workers 1                       # one stage at a time
    python flows/pipeline.py --target pretrain                 # every cell of a matrix stage (+ what they need)
    python flows/pipeline.py --target pretrain@standard-s-0 --downstream   # a cell and everything that depends on it
    python flows/pipeline.py --runner dask [--address tcp://scheduler:8786]   # Dask: a LocalCluster, or a cluster
    python flows/pipeline.py --runner slurm --workers 16       # Dask on SLURM jobs (dask-jobqueue, see README)
    python flows/pipeline.py --runner ray [--address ray://head:10001]        # Ray: a local instance, or a cluster

DVC owns the DAG and the cache: the flow reads the stage graph from DVC, so stages added later are picked up, and each
task runs `dvc repro --single-item <stage>` in a subprocess (training owns its process: Lightning's DDP launcher
re-executes the command), its output streamed into the Prefect log. Every task is submitted with its upstream tasks'
futures as inputs, so the Prefect UI draws the DAG and marks what did not run after a failure (NotReady).

Concurrency, measured on DVC 3.67: `dvc repro` holds the repo lock (.dvc/tmp/lock) while it reads the pipeline,
checks the stage, hashes and caches its outs and rewrites dvc.lock (read-modify-write of that stage's entry only), but
releases it while the stage's command runs (dvc.stage.decorators.unlocked_repo); the command's deps are read-locked
and its outs write-locked in .dvc/tmp/rwlock. So cells run concurrently as separate `dvc --wait-for-lock repro
--single-item` processes: they queue for the repo lock only for DVC's own bookkeeping, and dvc.lock is only ever
written under that lock. A stage whose files another running stage holds fails at once with a lock error (it cannot
happen between independent stages, whose paths do not overlap); the task retries it, not counting it as a failure.
A failed stage is retried (a crash; training resumes from its checkpoint), except when it exited with one of the
stage's own codes for bad input (2 params, 3 data, 4 non-finite loss: DETERMINISTIC), or DVC refused it before its
command ran for a reason the same files repeat (a params key it cannot find: failures.DVC_DETERMINISTIC), which a
retry would only repeat.

Stopping: SIGTERM or Ctrl-C stops the running stages, starts nothing more, and ends the warm server and the
temporary Prefect server with the flow (`main`, `wait_all`). Nothing of the flow holds state a kill -9 could corrupt
for its rerun (tests/test_crash.py, benchmarks/flow_crash.py).

Placement: at most `--workers` cells run at once, each on its share of the machine (scalelab.runtime.placement: cores /
workers threads; one GPU each on GPU nodes). On CPU nodes stage processes start warm (scalelab.pipeline.warm: forked from a
server that has done the imports). A stage `dvc status` reported up to date, none of whose upstream stages
ran in this flow, finishes at once as "up to date" without a subprocess: a second run reruns nothing and still shows
every stage it checked. The flow opens the MLflow parent run that the stages' child runs nest under, and ends with a
markdown artifact linking them.

Beside this file: dag.py (DVC's stage graph, what a target selects), failures.py (what is retried, stopping),
artifact.py (the markdown artifact), runners.py (where tasks run), lifetime.py (ending with the parent, and when the
exit path hangs), tempserver.py (the run's temporary Prefect server when PREFECT_API_URL is unset). `scalelab repro`
runs this file.
"""

import scalelab  # noqa: I001  first: sets PREFECT_HOME, telemetry off and the MLflow URI before prefect reads them

import argparse
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from prefect import allow_failure, flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from dvc.repo import Repo
from prefect.context import FlowRunContext
from prefect.runtime import flow_run
from prefect.states import Cancelled
from prefect.task_runners import ThreadPoolTaskRunner

from scalelab.pipeline import dvcrun, profile, warm
from scalelab.runtime import yamlio
from scalelab.runtime import placement
from scalelab.study import gate
from scalelab import tracking

sys.path.insert(0, str(Path(__file__).resolve().parent))  # flows/ (imported by path in tests)
import artifact  # noqa: E402
import dag  # noqa: E402
import failures  # noqa: E402
import runners  # noqa: E402
from artifact import status as _status, summary  # noqa: E402
from dag import changed_stages, select, stage_graph  # noqa: E402  (a test patches changed_stages here)
from failures import (  # noqa: E402  (also this module's names, as before the split: tests and serve use them)
    DEFAULT_RETRIES, DETERMINISTIC, StageFailed, retries_for, retryable, stage_exit, stop_stages,
)

for module in (runners, failures, dag, artifact):
    runners.by_value(module)
if __name__ != "__main__" and __name__ in sys.modules:  # imported by flows/serve.py
    runners.by_value(sys.modules[__name__])

RAN = ("ran", "restored from cache")
# DVC's messages when another process holds a lock it needs (dvc.rwlock, dvc.lock): retried, not a failure
LOCK_ERRORS = ("is busy, it is being blocked by", "Unable to acquire lock")
LOCK_PATIENCE_S = 900


@task(task_run_name="{stage}", retries=DEFAULT_RETRIES, retry_delay_seconds=5, retry_condition_fn=retryable,
      cache_policy=NO_CACHE)
def run_stage(stage: str, root: str, env: dict[str, str], changed: bool, upstream: dict[str, str]) -> str:
    """One stage cell: "up to date" at once when DVC reported it unchanged and none of its `upstream` stages (their
    statuses) ran in this flow; else `dvc repro --single-item` on a worker's share of the machine. Returns what DVC
    did: "ran", "restored from cache" or "up to date"."""
    logger = get_run_logger()
    if placement.STOP.is_set():
        return Cancelled(message="pipeline interrupted")
    if not changed and not any(status in RAN for status in upstream.values()):
        logger.info(f"{stage}: up to date")
        return "up to date"
    with placement.share() as share:
        if refused := gate.admit(stage, share):  # a study's time budget (scalelab.study.gate); no study: None
            logger.info(f"{stage}: not started: {refused}")
            return Cancelled(message=refused)
        gpus = f", GPU {share['CUDA_VISIBLE_DEVICES']}" if "CUDA_VISIBLE_DEVICES" in share else ""
        logger.info(f"{stage}: dvc repro, {share[scalelab.THREADS_ENV]} thread(s){gpus}")
        return repro(stage, Path(root), share | env, logger)


def repro(stage: str, root: Path, extra_env: dict[str, str], logger) -> str:
    """`dvc --wait-for-lock repro --single-item <stage>` (through scalelab.pipeline.dvcrun: dvc.lock read fast) with its output
    in the log; retried while it only met a lock another process holds."""
    env = {**os.environ, **extra_env, "PYTHONUNBUFFERED": "1", "DVC_NO_ANALYTICS": "1"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` in cmds: this venv
    cmd = [sys.executable, "-m", "scalelab.pipeline.dvcrun", "--wait-for-lock", "repro", "--single-item", stage]
    deadline = time.monotonic() + LOCK_PATIENCE_S
    for attempt in itertools.count(1):
        returncode, outcome, tail = _stream(cmd, root, env, stage, logger)
        if returncode == 0:
            return outcome
        if placement.STOP.is_set():
            return Cancelled(message=f"{stage}: stopped (pipeline interrupted)")
        if any(m in line for line in tail for m in LOCK_ERRORS) and time.monotonic() < deadline:
            delay = min(30, 2**attempt)
            logger.info(f"{stage}: DVC lock held by another process; retrying in {delay} s")
            time.sleep(delay)
            continue
        failure = StageFailed(stage, stage_exit(returncode, tail), tail)
        if failure.why:
            logger.error(f"{stage}: exit {failure.code}, a {failure.why}: not retried (the same input fails the same "
                         "way again)")
        raise failure


def _stream(cmd: list[str], root: Path, env: dict[str, str], stage: str, logger) -> tuple[int, str, list[str]]:
    outcome, tail = "up to date", []
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace"}
    # Its own process group, so that stop_stages reaches DVC and the stage it runs, and nothing else
    with subprocess.Popen(cmd, cwd=root, env=env, start_new_session=True, **pipe) as proc:
        with placement.LIVE_LOCK:
            placement.LIVE.add(proc)
        if placement.STOP.is_set():  # interrupted between the check in run_stage and the registration
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for line in proc.stdout:
            if not (line := line.rstrip()):
                continue
            logger.info(line)
            tail = [*tail[-19:], line]
            if line.startswith(f"Running stage '{stage}'"):
                outcome = "ran"
            elif line.startswith(f"Stage '{stage}' is cached"):
                outcome = "restored from cache"
    with placement.LIVE_LOCK:
        placement.LIVE.discard(proc)
    return proc.returncode, outcome, tail


def wait_all(futures) -> None:
    """Wait for every future, waking each second: a signal's Python handler (Ctrl-C's KeyboardInterrupt, SIGTERM's)
    runs in the main thread, and a wait blocked on a lock there is not interrupted when the kernel delivers the signal
    to another of the flow's threads (seen: Ctrl-C ignored for minutes while a cell ran). Ray's futures, which have no
    `done()`, are waited for as before."""
    for future in futures:
        done = getattr(future.wrapped_future, "done", None)
        while callable(done) and not done():
            future.wait(timeout=1)
        future.wait()  # at once when done; it keeps the task's final state, with its result, on the future


def _experiment(root: Path) -> str:
    params = root / "params.yaml"
    raw = yamlio.safe_load(params.read_text()) if params.is_file() else None
    return ((raw or {}).get("tracking") or {}).get("experiment", "scalelab")


@flow(name="scalelab-pipeline", task_runner=runners.task_runner("threads"))
def pipeline(targets: list[str] | None = None, downstream: bool = False, params_file: str | None = None,
             workers: int | None = None, gpus_per_task: float = 0) -> list[dict]:
    """Run the DVC stages (all, or `targets` as `dvc repro` would) as Prefect tasks, up to `workers` at once (default:
    one per GPU, else one per core up to 8); returns each stage's status in dependency order.

    `params_file` switches the profile first (composed, validated, then written over params.yaml; the old one: .prev).
    `gpus_per_task`: what each task asks a Ray cluster for (Ray hides GPUs from tasks that ask for none)."""
    logger, root = get_run_logger(), scalelab.project_root()
    # imported here, never a global of this module: the flow travels by value to Dask and Ray workers, where flows/
    # is not importable, and a global module would travel by name (lifetime is only ever the flow process's)
    import lifetime

    lifetime.watch_prefect()  # a SIGTERM that Prefect's handler takes still starts the exit watchdog
    placement.STOP.clear()  # a served flow runs many times in one process (flows/serve.py)
    if params_file and Path(params_file).resolve() != (root / "params.yaml").resolve():
        profile.switch(Path(params_file), root / "params.yaml")
        logger.info(f"params.yaml <- {params_file}")
    # Params are checked before any stage touches its outs by the DAG's head stage `validate` (scalelab.pipeline.check),
    # which every stage depends on: when it fails, every other task ends NotReady.
    dvcrun.patch()  # this process's DVC reads as its stages' DVC processes read: each YAML text parsed once (yamlcache)
    with Repo(str(root)) as repo:  # one index for the graph and the status (each read of it parses dvc.yaml)
        graph = stage_graph(root, repo)
        order = select(graph, targets, downstream)
        # a selection reads the status of its own stages only (a study's cells: a few of the DAG's hundreds)
        changed = changed_stages(root, order if targets else None, repo=repo)
    workers = workers or placement.default_workers()
    runner = FlowRunContext.get().task_runner
    local = isinstance(runner, ThreadPoolTaskRunner)
    if local:
        placement.open_pool(workers)
    where = f"{workers} at once on this machine" if local else f"on {type(runner).__name__} workers"
    logger.info(f"{len(order)} stages, {where}: {', '.join(order)}")
    tags = {"prefect.flow_run_id": flow_run.id, "scalelab.targets": " ".join(targets or ["all"])}
    # Stage processes start warm on this machine's CPUs (scalelab.pipeline.warm), the thread pool's tasks' and those of a
    # cluster the runner started here (runners.on_this_machine: its workers' stages cost a cold start each, ~8 CPU s a
    # micro cell); not on GPUs: CUDA does not survive a fork
    to_run = changed is None or bool(changed & set(order))  # else every task finishes at once, "up to date"
    warm_start = (runners.on_this_machine(runner) and to_run and not placement.local_gpus()
                  and os.environ.get(warm.WARM_ENV) != "0")
    try:
        # The warm server imports while the MLflow parent run is opened and the first stages start (they wait for it)
        served = [s for s in order if changed is None or s in changed]
        preload = warm.preload_for(served, {s: graph.nodes[s].get("cmd") for s in served})
        with (warm.server(root, logger.info, preload=preload) if warm_start else contextlib.nullcontext({}) as warm_env,
              tracking.pipeline_run(f"pipeline {flow_run.name}", experiment=_experiment(root), tags=tags) as parent):
            env = {tracking.FLOW_RUN_ENV: flow_run.id} | ({tracking.PARENT_ENV: parent.run_id} if parent.run_id else {})
            env |= warm_env
            futures = {}
            for stage in order:  # dependency order: a task's upstream futures exist when it is submitted
                upstream = {u: futures[u] for u in graph.successors(stage) if u in futures}
                is_changed = changed is None or stage in changed
                # Upstream results as inputs (the task skips DVC when none ran) and as wait_for: a failed one makes
                # this task NotReady after its run got the stage's name (allow_failure: not while reading inputs).
                with runners.resources(runner, gpus_per_task):
                    futures[stage] = run_stage.with_options(retries=retries_for(stage)).submit(
                        stage, str(root), env, is_changed, {u: allow_failure(f) for u, f in upstream.items()},
                        wait_for=list(upstream.values()))
            try:
                wait_all(futures.values())
            except BaseException:  # Prefect's TerminationSignal (SIGTERM), KeyboardInterrupt
                stop_stages()
                raise
            states = {stage: future.state for stage, future in futures.items()}
            results = [{"stage": stage, "status": _status(state)} for stage, state in states.items()]
            markdown = summary(results, graph, parent, root)
            create_markdown_artifact(markdown, key="scalelab-pipeline", description="DVC stages and their MLflow runs")
            if (report_md := root / "data/report/report.md").is_file():  # the report and its ledger, in Prefect
                create_markdown_artifact(report_md.read_text(), key="scalelab-report", description=str(report_md))
            failed = [stage for stage, state in states.items() if state.is_failed() or state.is_crashed()]
            if failed:
                raise RuntimeError(f"pipeline stopped: {', '.join(failed)} failed; "
                                   f"{sum(r['status'] == 'not run' for r in results)} stages not run")
            # the invariant of a concurrent run, on the stages that ran (what was up to date, DVC did not touch)
            ran = [r["stage"] for r in results if r["status"] == "ran"]
            if ran and (left := sorted((changed_stages(root, ran) or set()) & set(order))):
                logger.warning(f"DVC still reports changed after this run (edited while it ran?): {', '.join(left)}")
    finally:
        if local:
            placement.close_pool()
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", dest="targets", help="a stage or matrix cell (repeatable)")
    ap.add_argument("--downstream", action="store_true", help="run the targets and what depends on them")
    ap.add_argument("--params-file", help="a params file (e.g. configs/cpu-study.yaml) to switch in first")
    ap.add_argument("--workers", type=int, help="cells at once (default: one per GPU, else one per core up to 8)")
    ap.add_argument("--runner", choices=runners.KINDS, default="threads", help="where tasks run (default: here)")
    ap.add_argument("--address", help="an existing Dask scheduler or Ray cluster to run on")
    ap.add_argument("--gpus-per-task", type=float, default=0, help="GPUs each task asks a Ray cluster for")
    args = ap.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        ap.error("--workers must be at least 1")
    if missing := runners.missing_extra(args.runner):
        ap.error(missing)
    # SIGTERM ends this process as Ctrl-C does, through Python's exit path: Prefect's flow engine re-raises a SIGTERM
    # to the handler it found after stopping the flow, and under the default one the process died by the signal,
    # skipping the atexit hook that stops the temporary Prefect server (found alive 50 minutes later). The
    # warm server and the stages stop on the way out (pipeline's `with` and stop_stages). A second signal, or an exit
    # path that hangs (a dead Prefect server), and the death of the parent are lifetime's.
    import lifetime  # as in pipeline(): not a module global

    lifetime.exit_on((signal.SIGTERM, signal.SIGINT))
    lifetime.die_with_parent()
    import tempserver  # likewise

    tempserver.ensure()  # PREFECT_API_URL, else a temporary server of this run's (without Prefect's server imports)
    runner = runners.task_runner(args.runner, args.workers, args.address)
    pipeline.with_options(task_runner=runner)(targets=args.targets, downstream=args.downstream,
                                              params_file=args.params_file, workers=args.workers,
                                              gpus_per_task=args.gpus_per_task)


if __name__ == "__main__":
    main()
