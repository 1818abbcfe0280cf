"""Tables for the report and the docs: one value format, markdown and HTML renderings, and the ledger's columns."""

from __future__ import annotations

import html
from typing import Any

import polars as pl

from scalelab.ledger.claims import premises_text, regime_text, sesoi_text

MAX_ROWS = 40  # longer tables are cut in the report (the CSV beside it is whole)


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def md_table(df: pl.DataFrame, max_rows: int | None = MAX_ROWS) -> str:
    """The table in markdown, cut after `max_rows` (None: whole) with a line saying how many rows the CSV has more."""
    rows = [[_fmt(v) for v in r] for r in df.head(max_rows or df.height).iter_rows()]
    out = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    if max_rows and df.height > max_rows:
        out.append(f"\n({df.height - max_rows} more rows in the CSV)")
    return "\n".join(out)


def html_table(df: pl.DataFrame, max_rows: int | None = MAX_ROWS) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in df.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in r) + "</tr>"
                   for r in df.head(max_rows or df.height).iter_rows())
    more = f"<p>({df.height - max_rows} more rows in the CSV)</p>" if max_rows and df.height > max_rows else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def published_notes(entries: list[dict]) -> list[str]:
    """The ledger's published statements, each once, in order of first appearance: the table's notes, which its
    `published` column cites by number (several claims often quote the same passage)."""
    return list(dict.fromkeys(e["published"] for e in entries))


def ledger_frame(entries: list[dict]) -> pl.DataFrame:
    cols = ("claim", "metric", "effect ± spread", "paper", "smallest effect", "seeds", "verdict", "regime", "premises",
            "published")
    note = {text: i for i, text in enumerate(published_notes(entries), 1)}
    return pl.DataFrame([{"claim": e["claim"], "metric": e["metric"], "effect ± spread": _fmt(e["effect"])
                          + ("" if e["spread"] is None else f" ± {e['spread']:.3g}"),
                          "paper": _fmt(e["paper_effect"]), "smallest effect": sesoi_text(e), "seeds": e["n_seeds"],
                          "verdict": e["verdict"],
                          "regime": regime_text(e["regime"]), "premises": premises_text(e["premises"]),
                          "published": f"[{note[e['published']]}]"} for e in entries],
                        schema={k: pl.Int64 if k == "seeds" else pl.String for k in cols})


def ledger_markdown(entries: list[dict]) -> str:
    """A study's whole ledger for its README: claim, effect beside the paper's, the smallest effect of interest (and
    whether it was chosen post hoc), seeds and verdict (the verdict names a failed premise); regimes, premises and each
    smallest effect's reason in full stay in the ledger file."""
    df = ledger_frame(entries).select("claim", "effect ± spread", "paper", "smallest effect", "seeds", "verdict")
    rows = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    return "\n".join(rows + ["| " + " | ".join(_fmt(v).replace("|", "/") for v in r) + " |" for r in df.iter_rows()])
