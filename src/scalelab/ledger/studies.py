"""Committed studies (results/<study>/): what each ran (study.json: its profile, seeds, commit, command, wall time and
the generator of its ledger) and its ledger, read for the report and the README's table of what is decided. The
contract is docs/workflow.md "Committed studies"; a folder that does not meet it is reported with the reason, never
an error.

Every ledger is re-derivable: study.json's `generator` names a library function `fn(folder) -> entries` that rebuilds
the ledger from the study's committed raw per-cell metrics by today's code (`regenerate`); tests/test_ledgers.py
compares each with the committed file, and `python -m scalelab.ledger.studies --write results/<study>` rewrites it.
A study whose raw metrics today's code cannot read says so in `superseded`, and one kept as the reference of another
regime (a smaller budget) says so in `reference`: both stay out of the decided table and off the cards.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.ledger import claims as ledger_rules
from scalelab.ledger.claims import verdict_of
from scalelab.ledger.tables import md_table

STUDY = "study.json"
STUDY_FIELDS = ("name", "profile", "seeds", "commit", "command", "wall_time_s", "ledger")
# `headline` and `figure` shape the report's cards; `reference` (why) keeps a study of another regime in the tables
# but off its paper's card, which reads the study nearer the paper's regime
OPTIONAL_FIELDS = ("generator", "superseded", "headline", "figure", "reference")
LEDGER = re.compile(r"(?:[\w.-]+/)*claims_([a-d])\.json")  # the ledger's file name says its method
DECIDED = (ledger_rules.REPRODUCED, ledger_rules.CONTRADICTED)
TABLE_ONLY = "a table, no claims (its README)"  # the `problem` of a finished study whose spec names no ledger
# Studies taken out of results/ because they decide nothing and their ledgers needed code written for a retired
# protocol; each is read at the last commit that holds it (`git show <commit>:results/<name>/README.md`).
RETIRED_AT = "773c59f"
RETIRED = {
    "hidden-decoding": "sum-task probes with no room and a 20-step continued pretraining, run by scripts since "
                       "retired; every claim untested",
    "optbench-200": "the first optimizer protocol (the LR chosen on one seed over an even grid), superseded",
    "optbench-protocol": "the optimizer protocol at 64 steps on xxs and xs; optbench-sizes reruns it with reference "
                         "arms",
}


def read_study(folder: Path) -> dict:
    """One committed study: its study.json fields, its method (the ledger's letter) and ledger entries. Where the
    contract is not met, `entries` is None and `problem` says why in one line (the report lists it as such)."""
    study: dict[str, Any] = {"name": folder.name, "method": None, "entries": None, "problem": None}
    study |= dict.fromkeys(OPTIONAL_FIELDS)
    try:
        meta = json.loads((folder / STUDY).read_text())
        if "ledger" not in meta and "spec" in meta:  # its spec decides no claim: the README's tables are its result
            if missing := [f for f in STUDY_FIELDS if f != "ledger" and f not in meta]:
                raise ValueError(f"{STUDY} lacks {', '.join(missing)}")
            return study | {k: meta.get(k) for k in STUDY_FIELDS} | {"problem": TABLE_ONLY}
        if missing := [f for f in STUDY_FIELDS if f not in meta]:
            raise ValueError(f"{STUDY} lacks {', '.join(missing)}")
        if not (m := LEDGER.fullmatch(str(meta["ledger"]))):
            raise ValueError(f"ledger {meta['ledger']!r} is not a path to claims_<a|b|c|d>.json")
        if missing := meta.get("cells_missing"):  # a study run in slices, not finished: it decides nothing yet
            return study | {k: meta[k] for k in STUDY_FIELDS} | {
                "method": m.group(1),
                "problem": f"in progress: {missing} cells of its grid without a result (`scalelab study {folder.name}` "
                           "resumes it)"}
        entries = ledger_rules.read_claims(folder / meta["ledger"])
    except FileNotFoundError as e:
        spec = folder.parent.parent / "configs" / "studies" / f"{folder.name}.yaml"
        if e.filename == str(folder / STUDY) and spec.is_file():  # planned, no slice run yet: nothing to read
            return study | {"problem": f"not started: `scalelab study {folder.name}` runs its spec "
                                       f"({spec.relative_to(folder.parent.parent)})"}
        return study | {"problem": f"{os.path.relpath(e.filename, folder)} absent"}
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # malformed JSON or fields: named, not raised
        return study | {"problem": str(e).replace(str(folder) + "/", "")}
    return (study | {k: meta[k] for k in STUDY_FIELDS} | {k: meta.get(k) for k in OPTIONAL_FIELDS}
            | {"method": m.group(1), "entries": entries})


def cell_files(folder: Path, prefix: str, suffix: str = "") -> dict[str, Path]:
    """Every committed cell's file under `prefix` (e.g. "metrics/pretrain"), by file name: what a generator reads.
    A study's cells are results/<study>/cells/<cell>/, each with cell.json listing its files (scalelab.study.cells);
    the temporary folders of a write (dot-named) are not cells."""
    out = {}
    base = Path(folder) / "cells"
    for d in sorted(base.iterdir()) if base.is_dir() else []:
        if d.is_dir() and not d.name.startswith(".") and (d / "cell.json").is_file():
            for rel in json.loads((d / "cell.json").read_text()).get("files") or {}:
                if rel.startswith(prefix.rstrip("/") + "/") and rel.endswith(suffix):
                    out[Path(rel).name] = d / rel
    return dict(sorted(out.items()))


def committed_studies(results: Path) -> list[dict]:
    """Every folder of results/, in name order."""
    return [read_study(f) for f in sorted(Path(results).iterdir()) if f.is_dir()] if Path(results).is_dir() else []


def generator(spec: str):
    """The function a study.json `generator` ("package.module:function") names, judging the folder it is given as
    that committed study (claims.judging: a smallest effect declared after the study's cells ran reads post hoc)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"generator {spec!r} is not 'module:function'")
    fn = getattr(importlib.import_module(module), name)

    @functools.wraps(fn)
    def judged(folder, *args, **kwargs):
        with ledger_rules.judging(Path(folder).name):
            return fn(folder, *args, **kwargs)

    return judged


def regenerate(folder: Path) -> list[dict]:
    """The study's ledger rebuilt from its committed raw metrics by today's code (its study.json `generator`)."""
    meta = json.loads((Path(folder) / STUDY).read_text())
    if "generator" not in meta:
        raise ValueError(f"{Path(folder).name}: {STUDY} names no generator of its ledger")
    return generator(meta["generator"])(Path(folder))  # judged as this study (claims.py rule 4)


def write_ledger(folder: Path) -> Path:
    """Regenerate the study's ledger and write it where its study.json says."""
    meta = json.loads((Path(folder) / STUDY).read_text())
    path = Path(folder) / meta["ledger"]
    ledger_rules.write_claims(path, regenerate(folder))
    return path


def study_label(s: dict) -> str:
    seeds = ", ".join(map(str, s["seeds"])) if isinstance(s["seeds"], list) else s["seeds"]
    return f"{s['name']} (profile {s['profile']}, seeds {seeds}, commit {s['commit']})"


def _fmt_effect(e: dict) -> str:
    if e["effect"] is None:
        return "–"
    return f"{e['effect']:+.4f}" + ("" if e["spread"] is None else f" ± {e['spread']:.4f}")


def _paper(e: dict) -> str:
    p = e["paper_effect"]
    return "–" if p is None else f"{p:.4g}" if isinstance(p, float) else str(p)


def _regime(e: dict) -> str:
    """The regime in a table cell: this run's size, and its tokens per parameter beside the paper's where the paper
    states one (a ratio with nothing to compare, e.g. calibration tokens, says little)."""
    r = e["regime"]
    here = [f"{r['params'] / 1e6:.3g}M params"] if r.get("params") else []
    if r.get("tokens_per_param") and r.get("paper_tokens_per_param"):
        here.append(f"{r['tokens_per_param']:.2g} tokens/param, paper {r['paper_tokens_per_param']:g}")
    return ", ".join(here) + f" ({r['scope']})"


def studies_frame(studies: list[dict]) -> pl.DataFrame:
    """One row per committed study: what it ran, where, and its verdicts (or why it has no ledger)."""
    def verdicts(s: dict) -> str:
        if s["entries"] is None:
            return f"no ledger: {s['problem']}"
        counts = ", ".join(f"{n} {v}" for v, n in sorted(Counter(map(verdict_of, s["entries"])).items()))
        return counts + "".join(f" ({k}: {s[k]})" for k in ("superseded", "reference") if s.get(k))

    return pl.DataFrame([{"study": s["name"], "method": s["method"] or "–", "profile": s.get("profile", "–"),
                          "seeds": len(s["seeds"]) if isinstance(s.get("seeds"), list) else None,
                          "commit": s.get("commit", "–"), "wall_time_s": s.get("wall_time_s"),
                          "verdicts (all entries)": verdicts(s)} for s in studies],
                        schema={"study": pl.String, "method": pl.String, "profile": pl.String, "seeds": pl.Int64,
                                "commit": pl.String, "wall_time_s": pl.Float64, "verdicts (all entries)": pl.String})


def studies_table(results: Path) -> str:
    """The committed studies as a markdown table (docs/workflow.md)."""
    return md_table(studies_frame(committed_studies(results)))


def _main_entries(s: dict) -> list[dict]:
    """A per-size entry (`<id>@<size>`) is left out where the study also has its pooled `<id>`; where it has none
    (the compression study's `d.order.*@<ρ>` at one ρ), the per-size entry is the claim."""
    pooled = {e["id"] for e in s["entries"] if "@" not in e["id"]}
    return [e for e in s["entries"] if e["id"].split("@")[0] not in pooled or "@" not in e["id"]]


def _live(s: dict) -> bool:
    """A study the tables of decided and untested claims read: it has a ledger, and is neither superseded nor kept as
    a reference of another regime (those are named under the tables, with their counts)."""
    return s["entries"] is not None and not s.get("superseded") and not s.get("reference")


PER_STUDY = 3  # the README's decided table: at most this many rows of a study per verdict (its headline first)


def _shown(s: dict, entries: list[dict], per_study: int | None) -> list[dict]:
    """`entries` of study `s` in the order its study.json `headline` names them, then the ledger's; at most
    `per_study` (None: all)."""
    first = {i: n for n, i in enumerate(s.get("headline") or [])}
    ordered = sorted(entries, key=lambda e: first.get(e["id"], len(first)))  # stable: the ledger's order after
    return ordered if per_study is None else ordered[:per_study]


def decided_table(results: Path, per_study: int | None = None) -> str:
    """What the committed studies decided, grouped by verdict: the reproduced and the contradicted claims with their
    effect beside the paper's, their smallest effect of interest ("post hoc" where it was chosen after the study's
    cells ran), their regime and study; then how many claims a failed premise left untested (their table:
    `untested_table`). Inconclusive entries are counted per study below; superseded and reference studies and
    folders without a ledger are named there and decide nothing here. `per_study`: at most that many rows of a study
    per verdict, its headline first, the rest counted (`decided_summary`, the README's; this table whole is
    docs/workflow.md's)."""
    studies = committed_studies(results)
    live = [s for s in studies if _live(s)]
    rows = {v: [(s, e) for s in live for e in _main_entries(s) if verdict_of(e) == v]
            for v in (*DECIDED, ledger_rules.UNTESTED)}
    out = []
    for v in DECIDED:
        out += [f"**{v.capitalize()}** ({len(rows[v])})", ""]
        shown = [(s, e) for s in live for e in _shown(s, [e for t, e in rows[v] if t is s], per_study)]
        if shown:
            out += ["| claim | effect ± spread | paper | smallest effect | seeds | regime | study |",
                    "|---|---|---|---|---|---|---|"]
            out += [f"| {e['claim']} | {_fmt_effect(e)} | {_paper(e)} | {ledger_rules.sesoi_text(e)} | {e['n_seeds']} "
                    f"| {_regime(e)} | {s['name']} |" for s, e in shown]
            if hidden := len(rows[v]) - len(shown):
                out += ["", f"and {hidden} more, at most {per_study} a study shown here (every one: docs/workflow.md, "
                            "What the committed studies decided)"]
        else:
            out.append("none")
        out.append("")
    # the untested claims are counted here; their table, by study and failed premise, is `untested_table`
    # (docs/workflow.md): the README shows what was decided
    out += [f"**Untested: a premise failed** ({len(rows[ledger_rules.UNTESTED])}): by study and premise in "
            "docs/workflow.md, each claim's row in its study's ledger"]
    notes = []
    for s in studies:
        if s["entries"] is None:
            notes.append(f"{s['name']}: no ledger ({s['problem']})")
            continue
        main = _main_entries(s)
        counts = Counter(map(verdict_of, main))
        summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
        if s.get("superseded") or s.get("reference"):
            why = "superseded" if s.get("superseded") else "reference"
            # named alone: its profile, seeds and commits are in its README and in docs/workflow.md's tables
            notes.append(f"{s['name']}: {why} ({s[why]}); not in the tables ({summary}; "
                         f"results/{s['name']}/{s['ledger']})")
        else:
            notes.append(f"{study_label(s)}: {summary} (every entry: results/{s['name']}/{s['ledger']})")
    notes += [f"{name}: retired ({why}); read it at commit {RETIRED_AT} (`git show {RETIRED_AT}:results/{name}/README.md`)"
              for name, why in RETIRED.items() if not (results / name).exists()]
    return "\n".join(out) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def decided_summary(results: Path) -> str:
    """The README's table of decided claims: `decided_table` with at most PER_STUDY rows a study per verdict."""
    return decided_table(results, PER_STUDY)


def untested_table(results: Path) -> str:
    """The claims a failed premise left untested (docs/workflow.md), grouped by study and failed premise (a claim
    counts under each premise it fails): how many claims it leaves untested and its measured values, each cut at its
    first parenthesis; every claim's own row, with the whole value and the premise's need, is in the study's ledger."""
    live = [s for s in committed_studies(results) if _live(s)]
    groups: dict[tuple[str, str], tuple[set[str], list[str]]] = {}
    for s in live:
        for e in _main_entries(s):
            if verdict_of(e) != ledger_rules.UNTESTED:
                continue
            for p in ledger_rules.failed(e["premises"]):
                ids, values = groups.setdefault((s["name"], p["name"]), (set(), []))
                ids.add(e["id"])
                value = ledger_rules._short(p["value"]).split(" (")[0]
                if value not in values:
                    values.append(value)
    out = ["| study | premise that failed | claims | measured |", "|---|---|---|---|"]
    out += [f"| {study} | {name} | {len(ids)} | {'; '.join(values[:3]) + ('; …' if len(values) > 3 else '')} |"
            for (study, name), (ids, values) in groups.items()]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scalelab.ledger.studies",
                                 description="Regenerate committed studies' ledgers from their raw metrics.")
    ap.add_argument("folders", nargs="*", type=Path, help="results/<study> folders (default: every one)")
    ap.add_argument("--write", action="store_true", help="write each regenerated ledger where its study.json says")
    args = ap.parse_args(argv)
    folders = args.folders or [f for f in sorted(Path("results").iterdir()) if (f / STUDY).is_file()]
    stale = 0
    for folder in folders:
        meta = json.loads((folder / STUDY).read_text())
        if "generator" not in meta:  # a study whose spec decides no claim (hd-cpt-start): its README is its result
            print(f"{folder}: no ledger to regenerate ({STUDY} names no generator: "
                  f"{TABLE_ONLY if 'ledger' not in meta else 'its ledger cannot be re-derived'})")
            stale += "ledger" in meta  # a ledger nothing can re-derive breaks the contract; a table does not
            continue
        if args.write:
            print(f"{folder}: wrote {write_ledger(folder)}")
            continue
        same = json.loads(json.dumps(regenerate(folder))) == ledger_rules.read_claims(folder / meta["ledger"])
        stale += not same
        print(f"{folder}: {'matches' if same else 'differs from'} its committed ledger")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
