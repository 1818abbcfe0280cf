"""The report's first screen: one card per paper (its headline claims, each with the verdict of the committed study
that measured it, the premises and regime behind that verdict, and one figure), so a reader sees what is decided
before any table. Which claims are a study's headline is the study's own choice (study.json `headline`: ledger ids);
a study that names none shows its decided entries first; a study kept as a `reference` (another regime) is left off. A card shows at most PER_CARD rows, numbered, the decided
first, then each study's first in turn, and counts the rest. Its figure is those rows drawn at the card's width
(figures.effects: each effect with its spread against zero and the paper's), so it reads at its own size on a
laptop; a study's own figure (study.json `figure`) would shrink to a thumbnail there, so it is a link beside it.
"""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.ledger import claims as ledger_rules
from scalelab.ledger.claims import verdict_of

PAPERS = {  # method letter -> (what the paper is about, its sources)
    "a": ("Scale vectors in normalization layers", "arXiv 2605.26895"),
    "b": ("Optimizers for LLM training", "arXiv 2605.09176; Wen et al., arXiv 2509.02046; Semenov et al., "
          "arXiv 2509.01440"),
    "c": ("Hidden Decoding", "WeLM-HD; Sequential Hidden Decoding (Tencent WeChat AI)"),
    "d": ("SigmaScale compression", "arXiv 2606.07098; baselines ASVD arXiv 2312.05821, SVD-LLM arXiv 2403.07378"),
}
PER_CARD = 2  # rows a card shows (every card's verdicts near the first screen); the others are counted
# A card's content width in a laptop's 1400 px window (the report's 70em body in two columns): its figure is drawn at
# this width, so it shows at its own size, never a thumbnail
CARD_PX = 528
DETAIL_CHARS = 140  # a row's detail line beyond this is cut (whole in its tooltip and in the ledger below)
COLORS = {"reproduced": "#1a7f37", "contradicted": "#cf222e", "inconclusive": "#9a6700", "untested": "#57606a",
          "observation": "#57606a"}


@dataclass
class Card:
    key: str
    title: str
    sources: str
    rows: list[tuple[str, dict]] = field(default_factory=list)  # (study, entry)
    more: int = 0  # headline rows not shown
    figure: Path | None = None  # drawn for the card, at its width
    study_figure: Path | None = None  # the study's own figure (study.json `figure`), linked at full size


def headline(study: dict) -> list[dict]:
    """The study's headline entries: those its study.json names, else its decided ones, else its first ones."""
    entries = study["entries"] or []
    if ids := study.get("headline"):
        by_id = {e["id"]: e for e in entries}
        return [by_id[i] for i in ids if i in by_id]
    decided = [e for e in entries if verdict_of(e) in (ledger_rules.REPRODUCED, ledger_rules.CONTRADICTED)]
    return (decided or entries)[:PER_CARD]


def cards(studies: list[dict], results: Path, out: Path) -> list[Card]:
    """One card per paper; the figures the report draws for cards without one are written to `out`."""
    from scalelab.ledger import figures

    decided = (ledger_rules.REPRODUCED, ledger_rules.CONTRADICTED)
    made = []
    for key, (title, sources) in PAPERS.items():
        card, rows = Card(key, title, sources), []
        for s in studies:
            if s["method"] != key or s["entries"] is None or s.get("superseded") or s.get("reference"):
                continue
            rows += [(rank, s["name"], e) for rank, e in enumerate(headline(s))]
            if card.study_figure is None and s.get("figure") and (results / s["name"] / s["figure"]).is_file():
                card.study_figure = results / s["name"] / s["figure"]
        rows.sort(key=lambda r: (verdict_of(r[2]) not in decided, r[0]))  # decided first, then each study's first
        card.rows, card.more = [(s, e) for _, s, e in rows[:PER_CARD]], max(0, len(rows) - PER_CARD)
        if card.rows:  # drawn at the card's width, so it reads at its own size (a study's figure would shrink)
            card.figure = figures.effects([e for _, e in card.rows], out / f"card_{key}.png", width_px=CARD_PX)
        made.append(card)
    return made


def _effect(e: dict) -> str:
    if e["effect"] is None:
        return "no measurement"
    spread = "" if e["spread"] is None else f" ± {e['spread']:.2g}"
    paper = "" if e["paper_effect"] is None else f" (paper: {ledger_rules._short(e['paper_effect'])})"
    return f"{e['effect']:+.3g}{spread}{paper}"


def _regime(e: dict) -> str:
    """This run's size, and its tokens per parameter beside the paper's where the paper states one."""
    r = e["regime"]
    here = [f"{r['params'] / 1e6:.3g}M params"] if r.get("params") else []
    if r.get("tokens_per_param") and r.get("paper_tokens_per_param"):
        here.append(f"{r['tokens_per_param']:.2g} tokens/param (paper {r['paper_tokens_per_param']:g})")
    return ", ".join(here)


def _why(e: dict) -> str:
    """The failed premises of an untested entry (each value cut at its first parenthesis), else the names of those
    that held."""
    if bad := ledger_rules.failed(e["premises"]):
        return "failed: " + "; ".join(f"{p['name']}: {ledger_rules._short(p['value']).split(' (')[0]}" for p in bad)
    return ("held: " + ", ".join(p["name"] for p in e["premises"])) if e["premises"] else ""


def _detail(e: dict, study: str) -> str:
    return " · ".join(x for x in (_effect(e), _regime(e), _why(e), study) if x)


def _cut(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1].rstrip() + "…"


def _more(c: Card) -> str:
    return f"{c.more} more headline claim{'s' * (c.more != 1)} in the ledgers below" if c.more else ""


def markdown(cs: list[Card], out_dir: Path) -> str:
    """The cards in markdown, their figures linked relative to `out_dir` (where the report is written)."""
    parts = []
    for c in cs:
        parts.append(f"### {c.title}\n\n{c.sources}\n")
        if c.figure is not None:
            parts.append(f"![{c.figure.stem}]({os.path.relpath(c.figure, out_dir)})\n")
        if c.study_figure is not None:
            parts.append(f"[the study's figure]({os.path.relpath(c.study_figure, out_dir)})\n")
        if not c.rows:
            parts.append("no committed study yet\n")
        parts += [f"{i}. **{verdict_of(e)}**: {e['claim']} ({_detail(e, study)})" for i, (study, e) in enumerate(c.rows, 1)]
        parts += [f"\n({_more(c)})"] if c.more else []
        parts.append("")
    return "\n".join(parts)


def render_html(cs: list[Card]) -> str:
    out = []
    for c in cs:
        rows = [f"<li><span class='verdict' style='background:{COLORS.get(verdict_of(e), '#57606a')}'>"
                f"{html.escape(verdict_of(e))}</span> <span title='{html.escape(e['metric'])}'>"
                f"{html.escape(e['claim'])}</span><br><small title='{html.escape(_detail(e, study))}'>"
                f"{html.escape(_cut(_detail(e, study)))}</small></li>" for study, e in c.rows]
        more = f"<p class='sources'>{html.escape(_more(c))}</p>" if c.more else ""
        fig = ""
        if c.figure is not None:
            data = base64.b64encode(c.figure.read_bytes()).decode()
            fig = f"<img alt='{html.escape(c.figure.stem)}' src='data:image/png;base64,{data}'>"
        if c.study_figure is not None:  # embedded as a link target: the page stays one self-contained file
            data = base64.b64encode(c.study_figure.read_bytes()).decode()
            fig += (f"<p class='sources'><a download='{html.escape(c.study_figure.name)}' "
                    f"href='data:image/png;base64,{data}'>the study's figure</a></p>")
        body = f"<ol>{''.join(rows)}</ol>" if rows else "<p>no committed study yet</p>"
        out.append(f"<section class='card' id='card-{c.key}'><h3>{html.escape(c.title)}</h3>"
                   f"<p class='sources'>{html.escape(c.sources)}</p>{body}{more}{fig}</section>")
    return f"<div class='cards'>{''.join(out)}</div>"


STYLE = (".cards{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:1em;margin:1em 0}"
         ".card{border:1px solid #d0d7de;border-radius:8px;padding:.4em .8em;font-size:.8em;overflow:hidden}"
         ".card h3{margin:.1em 0}.card ol{padding-left:1.4em;margin:.3em 0}.card li{margin:.25em 0}"
         f".card img{{display:block;width:100%;max-width:{CARD_PX}px;height:auto}}"
         ".sources{color:#57606a;margin:0}.verdict{color:#fff;border-radius:4px;padding:0 .35em;font-size:.9em}"
         "details{margin:.5em 0}summary{cursor:pointer;font-weight:bold}")
