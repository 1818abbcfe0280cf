"""The committed Hidden Decoding study (results/hidden-decoding/): every part's ledger entries rebuilt from its
committed per-cell metrics and run.json by today's code, and the study's one ledger (claims_c.json), the generator
its study.json names.

Its parts ran from scripts since retired (each part's run.json names its command and commit): synthetic probes (v1
`probe/`, v2 `probe-k3/`, v3 `probe-v3/`) and continued pretraining of SmolLM2-135M (`cpt/` at 6 steps, `cpt-20/` at
20; its start measured in `cpt-start/`, no ledger entry). The probes are superseded by the parity probe (the hd-parity
study, scalelab.hidden_decoding.parity), the continued pretraining and its start by the hd-cpt study. The ledger holds v3
and the 20-step run, the later run of each kind (v1 and v2 predate the design changes of v3; the 6-step run is the
20-step one's earlier budget); every part's own claims.json is rewritten by `write_parts`. A probe's premises come
from the exact floor of its validation windows (scalelab.hidden_decoding.window_floor); a continued pretraining's from the
n = 2 − n = 1 gap over the budgets run with the same setup (6 then 20 steps: no run logged a step-0 or intermediate
validation).

    python -m scalelab.hidden_decoding.study results/hidden-decoding     # rewrite claims_c.json and the parts' ledgers
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
from pathlib import Path

from scalelab.ledger import claims as ledger
from scalelab.hidden_decoding import premises as hdp
from scalelab.hidden_decoding import ledger as hdr
from scalelab.hidden_decoding.window_floor import Floors, sum_task_floors
from scalelab.config import HiddenDecodingConfig
from scalelab.hidden_decoding.sum_task import SumTask

PROBES = ("probe", "probe-k3", "probe-v3")
CPT = ("cpt", "cpt-20")  # the same setup at growing budgets, in order
LEDGER = ("probe-v3", "cpt-20")
DEFAULT_TASK = SumTask(5, 7, 7)  # run_probe.py's task when its command names none
BUDGET_KEYS = ("max_steps", "val_every", "ckpt_every")


def _run(folder: Path, part: str) -> dict:
    path = folder / part / "run.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing; every part of the study records its run")
    return json.loads(path.read_text())


def kind_of(run: dict) -> str:
    """"probe" or "cpt": which retired script ran the part (its recorded command)."""
    for kind, script in (("probe", "run_probe.py"), ("cpt", "run_cpt.py")):
        if script in run.get("command", ""):
            return kind
    raise ValueError(f"run.json command {run.get('command')!r} names neither run_probe.py nor run_cpt.py")


def part_config(run: dict) -> HiddenDecodingConfig:
    """The part's cells, grid, seeds and claims settings (all the summary reads) from its run.json params."""
    p = run["params"]
    return HiddenDecodingConfig(cells=p["cells"], grid=p["grid"], seeds=p["seeds"],
                                claims={k: p["claims"][k] for k in ("sfa_fraction", "level")})


def probe_task(run: dict) -> SumTask:
    """The probe's task: run.json's `task`, else the flags of its recorded command (run_probe.py's defaults)."""
    if "task" in run:
        return SumTask(**run["task"])
    words = shlex.split(run["command"])
    flag = lambda name, dflt: int(words[words.index(name) + 1]) if name in words else dflt  # noqa: E731
    return SumTask(flag("--digits", DEFAULT_TASK.K), flag("--base", DEFAULT_TASK.base),
                   flag("--mod", DEFAULT_TASK.mod))


def probe_floors(run: dict) -> Floors:
    train = run["params"]["train"]
    return sum_task_floors(probe_task(run), train["seq_len"], train["val_tokens"])


def _n1_loss(cells: dict, hd: HiddenDecodingConfig) -> float:
    base1 = hdr.roles(hd)["base"].get(1)
    if base1 is None:
        raise ValueError("a probe needs its n = 1 cell (the reference the room is measured on)")
    return statistics.fmean(m["val_loss"] for m in cells[base1].values())


def _differ(a: dict, b: dict, prefix: str = "") -> list[str]:
    """Settings both dicts hold with different values (a key only one holds is a setting added since, at its
    default: not a difference in what ran)."""
    out = []
    for k in sorted(a.keys() & b.keys()):
        if isinstance(a[k], dict) and isinstance(b[k], dict):
            out += _differ(a[k], b[k], f"{prefix}{k}.")
        elif a[k] != b[k]:
            out.append(prefix + k)
    return out


def _curves(folder: Path, part: str) -> dict[str, dict[int, list[tuple[float, float]]]]:
    """cell → seed → [(tokens, val_loss)] over the CPT parts up to `part`, which must share one setup (backbone,
    cells, training settings but the budget)."""
    ref = _run(folder, part)
    setup = lambda r: {"source_digest": r.get("source_digest"), "cells": r["params"]["cells"],  # noqa: E731
                       "train": {k: v for k, v in r["params"]["train"].items() if k not in BUDGET_KEYS}}
    out: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for earlier in CPT[:CPT.index(part) + 1] if part in CPT else (part,):
        run = _run(folder, earlier)
        if differ := _differ(setup(run), setup(ref)):
            raise ValueError(f"{earlier} and {part} differ in {', '.join(differ)}: not one curve")
        hd = part_config(run)
        for cell, by_seed in hdr.collect(folder / earlier / "metrics", hd).items():
            for seed, m in by_seed.items():
                out.setdefault(cell, {}).setdefault(seed, []).append((float(m["tokens"]), m["val_loss"]))
    return out


def part_entries(folder: Path, part: str) -> list[dict]:
    """The ledger entries of one part, as today's code derives them from its committed metrics."""
    folder, run = Path(folder), _run(Path(folder), part)
    hd = part_config(run)
    cells = hdr.collect(folder / part / "metrics", hd)
    cmp = hdr.comparisons(cells, hd)
    kind = kind_of(run)
    if kind == "probe":
        control = run.get("positive_control")  # the cell that gains by construction; no committed probe ran one
        gains = hdr.paired(cells, hdr.roles(hd)["base"][1], control) if control else None
        setting = hdr.Setting(hd, cells, probe=[*hdp.probe_premises(probe_floors(run), _n1_loss(cells, hd)),
                                                hdp.positive_control(gains, hd.claims.level)])
    else:
        setting = hdr.Setting(hd, cells, curves=_curves(folder, part))
    return hdr.claims(cmp, setting, hd.claims.sfa_fraction, hd.claims.level)


def part_label(folder: Path, part: str, entries: list[dict]) -> str:
    """How the study's ledger names a part's rows: the task and the n = 1 model's measured room for a probe, the
    budget (from the entries' regime) for a continued pretraining."""
    run = _run(Path(folder), part)
    if kind_of(run) == "probe":
        hd = part_config(run)
        closed = probe_floors(run).closed(_n1_loss(hdr.collect(Path(folder) / part / "metrics", hd), hd))
        return f"probe, {probe_task(run).describe()} (n = 1 closes {closed:.1%} of the windows' floor gap)"
    reg = entries[0]["regime"]
    return f"SmolLM2 continued pretraining ({reg['steps']} steps, {reg['tokens']} tokens)"


def study_ledger(folder: Path) -> list[dict]:
    """The study's ledger (study.json `generator`): the entries of the parts in LEDGER, each id and claim prefixed
    by the part that measured it."""
    out = []
    for part in LEDGER:
        entries = part_entries(folder, part)
        label = part_label(folder, part, entries)
        out += [e | {"id": f"{part}.{e['id']}", "claim": f"{label}: {e['claim']}"} for e in entries]
    return out


def write_parts(folder: Path) -> None:
    """Rewrite every part's claims.json and the study's ledger from the committed metrics."""
    folder = Path(folder)
    with ledger.judging(folder.name):  # as studies.regenerate judges it: a smallest effect declared later is post hoc
        for part in PROBES + CPT:
            ledger.write_claims(folder / part / "claims.json", part_entries(folder, part))
        meta = json.loads((folder / "study.json").read_text())
        ledger.write_claims(folder / meta["ledger"], study_ledger(folder))


# ---- tables for the study's README (generated blocks)
def _num(x: float | None, fmt: str = "+.4f") -> str:
    return "–" if x is None else format(x, fmt)


def claims_table(entries: list[dict]) -> str:
    """A part's claims.json as a table: id, effect ± its t half-width, seeds, verdict."""
    rows = ["| claim | effect | ± (95% t half-width) | seeds | verdict |", "|---|---|---|---|---|"]
    rows += [f"| {e['id']} | {_num(e['effect'])} | {_num(e['spread'], '.4f')} | {e['n_seeds']} | {e['verdict']} |"
             for e in entries]
    return "\n".join(rows)


def premises_table(entries: list[dict]) -> str:
    """Each distinct premise of a ledger (name, measured value, need, held) once."""
    seen: dict[tuple, dict] = {}
    for e in entries:
        for p in e["premises"]:
            seen.setdefault((e["id"].split(".")[0], p["name"], str(p["value"])), p)
    rows = ["| part | premise | measured | need | holds |", "|---|---|---|---|---|"]
    rows += [f"| {part} | {p['name']} | {p['value']} | {p['need']} | {'yes' if p['passed'] else 'no'} |"
             for (part, _, _), p in seen.items()]
    return "\n".join(rows)


def cells_table(summary: dict) -> str:
    """A part's summary.json cells: n, attention, tables, steps, val loss mean ± sd over seeds."""
    rows = ["| cell | n | attention | tables | steps | val loss (mean ± sd over seeds) |", "|---|---|---|---|---|---|"]
    for c in summary["cells"]:
        sd = "" if c["val_loss_std"] is None else f" ± {c['val_loss_std']:.4f}"
        rows.append(f"| {c['cell']} | {c['n_streams']} | {c['attention']} | {c['tables']} | {c['steps']} | "
                    f"{c['val_loss']:.4f}{sd} |")
    return "\n".join(rows)


def seed_table(*metrics: dict) -> str:
    """Per-cell, per-seed metrics files: n, steps, tokens, val loss, step time, wall."""
    rows = ["| cell | seed | n | steps | tokens | val loss | step time (s) | wall (s) |", "|---" * 8 + "|"]
    rows += [f"| {m['cell']} | {m['seed']} | {m['n_streams']} | {m['steps']} | {m['tokens']} | {m['val_loss']:.4f} | "
             f"{m['step_time_s']:.2f} | {m['wall_s']:.0f} |" for m in metrics]
    return "\n".join(rows)


def cpt_start_table(table: dict) -> str:
    """cpt-start/table.json: n = 2's step-0 validation loss gap to n = 1 under each start setting."""
    rows = ["| start | positions | mixing layers | embed_noise | loss(n = 2) − loss(n = 1) at step 0 "
            "| sd over windows |", "|---|---|---|---|---|---|"]
    for r in table["rows"]:
        mixing = "all" if r["mixing"] == "all" else f"default ({len(r['mixing_layers'])})"
        gap = "0 exactly (every window)" if r["gap_max_abs"] == 0 else f"{r['gap']:+.4f}"
        rows.append(f"| {r['start']} | {r['positions']} | {mixing} | {r['embed_noise']:g} | {gap} | "
                    f"{r['gap_sd']:.4f} |")
    return "\n".join(rows)


def run_line(run: dict) -> str:
    """What ran: the commit, the wall time (the cells' for a part whose cells ran as separate processes) and the
    command, from the part's run.json."""
    wall = f"cells {run['cells_wall_s']} s" if "cells_wall_s" in run else f"{run['wall_s']} s"
    return f"commit {run['commit'][:10]}, wall {wall}; command: `{run['command']}`"


def floors_line(run: dict) -> str:
    """A probe's references on its validation windows: the floor, the sum-blind loss, the stationary floor."""
    f = probe_floors(run)
    return (f"floor {f.floor:.4f} on the validation windows (stationary {f.stationary:.4f}), "
            f"sum-blind {f.sum_blind:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    write_parts(ap.parse_args().folder)


if __name__ == "__main__":
    main()
