"""Which of a study's cells a run takes (`--cells`, `--refresh`), what it says about the others, and `--plan`."""

from __future__ import annotations

import fnmatch
from collections import defaultdict
from dataclasses import dataclass

from scalelab.study import cells
from scalelab.study.costs import Cost, Estimator, duration, eta, plural, total, within
from scalelab.study.spec import SpecError


@dataclass(frozen=True)
class Selection:
    todo: list[cells.Status]        # to run, in grid order
    done: list[cells.Status]        # skipped: committed with the same key and code hash
    stale: list[cells.Status]       # kept (not refreshed)
    outside: int                    # grid cells --cells left out


def matches(address: str, patterns: list[str]) -> bool:
    """A --cells pattern matches a cell's address (pretrain@none-xs-0) or its cell name (none-xs-0)."""
    name = address.split("@", 1)[-1]
    return any(fnmatch.fnmatchcase(address, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


def select(statuses: list[cells.Status], patterns: list[str] | None, refresh: bool) -> Selection:
    patterns = [p for arg in patterns or [] for p in arg.split(",") if p]
    for p in patterns:
        if not any(matches(s.cell.address, [p]) for s in statuses):
            raise SpecError(f"--cells: {p!r} matches no cell of the study")
    chosen = [s for s in statuses if not patterns or matches(s.cell.address, patterns)]
    todo = [s for s in chosen if s.state == cells.MISSING or (refresh and s.state == cells.STALE)]
    return Selection(todo, [s for s in chosen if s.state == cells.DONE],
                     [s for s in chosen if s.state == cells.STALE and not refresh], len(statuses) - len(chosen))


def status_lines(sel: Selection, root) -> list[str]:
    """One `skip` line per done cell; the stale ones kept, grouped by stage, the commit they ran and what changed."""
    lines = [f"skip   {s.cell.address} (done: {s.record.folder.relative_to(root)})" for s in sel.done]
    groups: dict[tuple, int] = defaultdict(int)
    for s in sel.stale:
        groups[(s.cell.stage, (s.record.meta.get("commit") or "?")[:7], s.why)] += 1
    for (stage, commit, why), n in groups.items():
        paths = why.split(", ")
        why = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
        lines.append(f"stale  {n} {stage} cell{'s' * (n > 1)} ran other code (commit {commit}; changed: {why}): "
                     "kept for the ledger, marked stale; --refresh reruns them")
    return lines


def costs_of(sel: Selection, est: Estimator) -> list[tuple[str, Cost]]:
    return [(s.cell.address, est.cost(s.cell)) for s in sel.todo]


def plan_lines(name: str, statuses: list[cells.Status], sel: Selection, est: Estimator, workers: int,
               budget_s: float | None, root) -> list[str]:
    """What --plan prints: the grid's state, the status lines, then each cell left with its estimated cost."""
    count = lambda state: sum(s.state == state for s in statuses)  # noqa: E731
    stages = defaultdict(int)
    for s in statuses:
        stages[s.cell.stage] += 1
    lines = [f"study {name}: {plural(len(statuses), 'cell')} ({', '.join(f'{st} {n}' for st, n in stages.items())}): "
             f"{count(cells.DONE)} done, {count(cells.STALE)} stale, {count(cells.MISSING)} missing"
             + (f"; --cells leaves out {sel.outside}" if sel.outside else "")]
    lines += status_lines(sel, root)
    costs = costs_of(sel, est)
    reasons = {s.cell.address: s for s in sel.todo}
    for address, cost in costs:
        s = reasons[address]
        why = " (stale: rerun)" if s.state == cells.STALE else " (params changed)" if s.why else ""
        lines.append(f"run    {address}{why}: {cost}")
    if not costs:
        lines.append("nothing to run")
        return lines
    known, unknown = total([c for _, c in costs])
    wall = eta([c for _, c in costs], [], workers)
    lines.append(f"to run: {plural(len(costs), 'cell')}"
                 + (f", {duration(known)} of cell time" if unknown < len(costs) else "")
                 + (f", {unknown} of unknown cost" if unknown else "")
                 + (f"; about {duration(wall)} at {workers} at once" if wall is not None else ""))
    if budget_s is not None:
        fits = within(costs, budget_s, workers)
        lines.append(f"--max-minutes {budget_s / 60:g}: would start {len(fits)} of them "
                     f"({len(costs) - len(fits)} left for a later run)")
    return lines
