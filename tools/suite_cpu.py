"""Where a command's CPU goes: the CPU seconds of every process it starts, by kind of process and by the test that
started it, sampled from /proc while it runs (Linux).

    python tools/suite_cpu.py --out /tmp/suite-cpu.json -- make test
    python tools/suite_cpu.py --top 30 -- .venv/bin/python -m pytest tests/test_flow.py

The suite's own per-file table (tests/conftest.py) gives wall seconds, which on two shared cores mix a test's work
with its neighbour's; CPU seconds add up across workers, so they rank what to cut. Every process the command starts
carries a marker in its environment (servers that detach from the tree included, as conftest's leak check finds
them), and each is read every `--every` seconds: its user + system CPU (utime + stime) when last seen, its command
line, and PYTEST_CURRENT_TEST from its environment (what pytest sets while a test runs, inherited by what it starts).
A process that lives under one interval is missed, and one's last interval before it exits; the report says how much
of the machine's CPU over the run (from /proc/stat) that leaves unattributed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
MARK = "SCALELAB_SUITE_CPU"
# (kind, pattern on the command line), first match wins: what the suite starts
# (a test's temporary paths hold "pytest-of-...": no bare "pytest"; a warm server's command line lists its preloads,
# scalelab.pipeline.dvcrun among them: the server before the DVC command)
KINDS = (
    ("pytest worker", r"exec\(eval\(sys\.stdin|-m pytest\b|bin/pytest\b|pytest/__main__"),  # execnet's: xdist's
    ("warm server", r"scalelab\.pipeline\.warm|pipeline/warm\.py"),
    ("dvc (the flow's, per stage)", r"scalelab\.pipeline\.dvcrun"),
    ("dvc exp workers", r"dvc exp (exec-run|queue-worker)"),
    ("dvc", r"-m dvc\b|bin/dvc\b|dvc/__main__"),
    ("stage", r"stages/\w+\.py|scalelab\.pipeline\.check|pipeline/check\.py"),
    ("flow", r"flows/pipeline\.py|workspace\.py build|scalelab study|scalelab repro|pipeline/cli\.py"),
    # MLflow's server is a uvicorn too (mlflow.server.fastapi_app): matched first, by its app, so a Prefect server is
    # counted by its own (prefect.server.api, the temporary one; `prefect server`, the CLI's)
    ("mlflow server", r"mlflow (server|ui)|mlflow\.server\.|gunicorn|huey"),
    ("prefect server", r"prefect\.server\.api|prefect server"),
    ("browser", r"chrom"),
    ("postgres", r"postgres"),
    ("sshd", r"sshd|ssh "),
    ("ray", r"\bray\b|raylet|gcs_server|plasma"),
    ("dask", r"distributed|dask"),
    ("git", r"(^|/)git\b"),
)


def kind_of(cmdline: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, cmdline):
            return kind
    return "other: " + (Path(cmdline.split(" ", 1)[0]).name or "?")


def _read(pid: str) -> tuple[float, str, str, int, float, str] | None:
    """(CPU seconds, command line, test, parent pid, start time, name) of a marked process; None if it is not marked
    or gone."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if not any(v.startswith(MARK.encode() + b"=") for v in env):
            return None
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    test = next((v.split(b"=", 1)[1].decode(errors="replace") for v in env if v.startswith(b"PYTEST_CURRENT_TEST=")),
                "")
    return (int(stat[11]) + int(stat[12])) / TICK, cmd, test.rsplit(" (", 1)[0], int(stat[1]), float(stat[19]), comm


def _machine_cpu() -> float:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(v) for i, v in enumerate(fields) if i not in (3, 4)) / TICK  # all but idle and iowait


def measure(cmd: list[str], every: float = 0.2) -> dict:
    """Run `cmd` and sample its processes until it exits: {"exit", "wall_s", "machine_cpu_s", "processes"}."""
    token = uuid.uuid4().hex
    seen: dict[tuple[str, float], dict] = {}  # (pid, start time) -> what was last read of it
    machine, started = _machine_cpu(), time.monotonic()
    proc = subprocess.Popen(cmd, env={**os.environ, MARK: token})
    while True:
        done = proc.poll() is not None
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if (got := _read(pid)) is None:
                continue
            row = seen.setdefault((pid, got[4]), {"pid": int(pid), "ppid": got[3], "cmd": got[1], "test": got[2]})
            row["cpu_s"], row["comm"] = got[0], got[5]  # a forked child names itself after its fork
            row["test"] = row["test"] or got[2]
        if done:
            break
        time.sleep(every)
    return {"exit": proc.returncode, "wall_s": time.monotonic() - started, "machine_cpu_s": _machine_cpu() - machine,
            "processes": list(seen.values())}


def report(result: dict, top: int = 20) -> str:
    procs = result["processes"]
    total = sum(p["cpu_s"] for p in procs)
    by_kind, count, by_test = Counter(), Counter(), Counter()
    cmds = {p["pid"]: p["cmd"] for p in procs}
    for p in procs:
        kind = kind_of(p["cmd"])
        if kind == "warm server" and kind_of(cmds.get(p["ppid"], "")) == "warm server":
            # forked by the warm server, its command line the server's: a stage or a DVC command, by the name the
            # child gives itself (scalelab.pipeline.warm)
            kind = "dvc (the flow's, per stage)" if p.get("comm") == "scalelab-dvc" else "stage"
        by_kind[kind] += p["cpu_s"]
        count[kind] += 1
        if kind != "pytest worker":  # a worker's CPU spans every test it ran
            by_test[p["test"] or "(outside a test)"] += p["cpu_s"]
    lines = [f"exit {result['exit']}, {result['wall_s']:.0f} s of wall time; CPU of the command's processes "
             f"{total:.0f} s, of the machine meanwhile {result['machine_cpu_s']:.0f} s (the rest: other work, and "
             f"processes shorter than a sample)", "", "CPU s  processes  kind"]
    lines += [f"{s:7.1f}  {count[k]:9d}  {k}" for k, s in by_kind.most_common()]
    lines += ["", f"CPU s  test (its subprocesses; the {top} largest)"]
    lines += [f"{s:7.1f}  {t}" for t, s in by_test.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="also write every process's row here (JSON)")
    ap.add_argument("--every", type=float, default=0.2, help="seconds between samples")
    ap.add_argument("--top", type=int, default=20, help="tests listed")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given (put it after --)")
    result = measure(cmd, args.every)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(report(result, args.top))
    return result["exit"]


if __name__ == "__main__":
    sys.exit(main())
