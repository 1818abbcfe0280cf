"""Committed studies (results/<study>/): what each ran (study.json: its profile, seeds, commit, command and wall time)
and its ledger, read for the report and the README's table of what is decided. The contract is docs/workflow.md
"Committed studies"; a folder that does not meet it is reported with the reason, never an error.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.analysis import claims as ledger_rules
from scalelab.analysis.tables import md_table

STUDY = "study.json"
STUDY_FIELDS = ("name", "profile", "seeds", "commit", "command", "wall_time_s", "ledger")
LEDGER = re.compile(r"(?:[\w.-]+/)*claims_([a-d])\.json")  # the ledger's file name says its method


def read_study(folder: Path) -> dict:
    """One committed study: its study.json fields, its method (the ledger's letter) and ledger entries. Where the
    contract is not met, `entries` is None and `problem` says why in one line (the report lists it as such)."""
    study: dict[str, Any] = {"name": folder.name, "method": None, "entries": None, "problem": None}
    try:
        meta = json.loads((folder / STUDY).read_text())
        if missing := [f for f in STUDY_FIELDS if f not in meta]:
            raise ValueError(f"{STUDY} lacks {', '.join(missing)}")
        if not (m := LEDGER.fullmatch(str(meta["ledger"]))):
            raise ValueError(f"ledger {meta['ledger']!r} is not a path to claims_<a|b|c|d>.json")
        entries = ledger_rules.read_claims(folder / meta["ledger"])
    except FileNotFoundError as e:
        return study | {"problem": f"{os.path.relpath(e.filename, folder)} absent"}
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # malformed JSON or fields: named, not raised
        return study | {"problem": str(e).replace(str(folder) + "/", "")}
    return study | {k: meta[k] for k in STUDY_FIELDS} | {"method": m.group(1), "entries": entries}


def committed_studies(results: Path) -> list[dict]:
    """Every folder of results/, in name order."""
    return [read_study(f) for f in sorted(Path(results).iterdir()) if f.is_dir()] if Path(results).is_dir() else []


def study_label(s: dict) -> str:
    seeds = ", ".join(map(str, s["seeds"])) if isinstance(s["seeds"], list) else s["seeds"]
    return f"{s['name']} (profile {s['profile']}, seeds {seeds}, commit {s['commit']})"


def verdict_of(e: dict) -> str:
    """The verdict without its reason: 'inconclusive (1 seed)' -> 'inconclusive'."""
    return e["verdict"].split(" (")[0]


def _fmt_effect(e: dict) -> str:
    return f"{e['effect']:+.4f}" + ("" if e["spread"] is None else f" ± {e['spread']:.4f}")


def studies_frame(studies: list[dict]) -> pl.DataFrame:
    """One row per committed study: what it ran, where, and its verdicts (or why it has no ledger)."""
    def verdicts(s: dict) -> str:
        return (", ".join(f"{n} {v}" for v, n in sorted(Counter(map(verdict_of, s["entries"])).items()))
                if s["entries"] is not None else f"no ledger: {s['problem']}")

    return pl.DataFrame([{"study": s["name"], "method": s["method"] or "–", "profile": s.get("profile", "–"),
                          "seeds": len(s["seeds"]) if isinstance(s.get("seeds"), list) else None,
                          "commit": s.get("commit", "–"), "wall_time_s": s.get("wall_time_s"),
                          "verdicts (all entries)": verdicts(s)} for s in studies],
                        schema={"study": pl.String, "method": pl.String, "profile": pl.String, "seeds": pl.Int64,
                                "commit": pl.String, "wall_time_s": pl.Float64, "verdicts (all entries)": pl.String})


def studies_table(results: Path) -> str:
    """The committed studies as a markdown table (docs/workflow.md)."""
    return md_table(studies_frame(committed_studies(results)))


def decided_table(results: Path) -> str:
    """What the committed studies decided (README): every claim whose interval excludes 0, with the study that
    decided it; per-size entries that a pooled entry sums up, and inconclusive claims, are counted below the table;
    studies without a ledger named."""
    studies = committed_studies(results)
    rows = ["| claim | effect ± spread | seeds | verdict | study |", "|---|---|---|---|---|"]
    notes = []
    for s in studies:
        if s["entries"] is None:
            notes.append(f"{s['name']}: no ledger ({s['problem']})")
            continue
        # a per-size entry (`<id>@<size>`) is left out where the study also has its pooled `<id>`; where it has
        # none (the compression study's `d.order.*@<ρ>` at one ρ), the per-size entry is the claim
        pooled = {e["id"] for e in s["entries"] if "@" not in e["id"]}
        main = [e for e in s["entries"] if e["id"].split("@")[0] not in pooled or "@" not in e["id"]]
        decided = [e for e in main if verdict_of(e) not in (ledger_rules.INCONCLUSIVE, "observation")]
        rows += [f"| {e['claim']} | {_fmt_effect(e)} | {e['n_seeds']} | **{verdict_of(e)}** | "
                 f"{s['name']} |" for e in decided]
        notes.append(f"{study_label(s)}: {len(decided)} of {len(main)} claims decided, {len(main) - len(decided)} "
                     f"inconclusive (every entry: results/{s['name']}/{s['ledger']})")
    return "\n".join(rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
