"""The report's first screen: one card per paper (its headline claims, each with the verdict of the committed study
that measured it, the premises and regime behind that verdict, and one figure of the study), so a reader sees what is
decided before any table. Which claims are a study's headline, and its figure, are the study's own choice (study.json
`headline`: ledger ids, `figure`: a PNG in its folder); a study that names none shows its decided entries first.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

from scalelab.analysis import claims as ledger_rules
from scalelab.analysis.claims import verdict_of

PAPERS = {  # method letter -> (what the paper is about, its sources)
    "a": ("Scale vectors in normalization layers", "arXiv 2605.26895"),
    "b": ("Optimizers for LLM training", "arXiv 2605.09176; Wen et al., arXiv 2509.02046; Semenov et al., "
          "arXiv 2509.01440"),
    "c": ("Hidden Decoding", "WeLM-HD; Sequential Hidden Decoding (Tencent WeChat AI)"),
    "d": ("SigmaScale compression", "arXiv 2606.07098; baselines ASVD arXiv 2312.05821, SVD-LLM arXiv 2403.07378"),
}
PER_CARD = 3  # headline rows a card shows when its studies name none
COLORS = {"reproduced": "#1a7f37", "contradicted": "#cf222e", "inconclusive": "#9a6700", "untested": "#57606a",
          "observation": "#57606a"}


@dataclass
class Card:
    key: str
    title: str
    sources: str
    rows: list[tuple[str, dict]] = field(default_factory=list)  # (study, entry)
    figure: Path | None = None


def headline(study: dict) -> list[dict]:
    """The study's headline entries: those its study.json names, else its decided ones, else its first ones."""
    entries = study["entries"] or []
    if ids := study.get("headline"):
        by_id = {e["id"]: e for e in entries}
        return [by_id[i] for i in ids if i in by_id]
    decided = [e for e in entries if verdict_of(e) in (ledger_rules.REPRODUCED, ledger_rules.CONTRADICTED)]
    return (decided or entries)[:PER_CARD]


def cards(studies: list[dict], results: Path) -> list[Card]:
    out = []
    for key, (title, sources) in PAPERS.items():
        card = Card(key, title, sources)
        for s in studies:
            if s["method"] != key or s["entries"] is None or s.get("superseded"):
                continue
            card.rows += [(s["name"], e) for e in headline(s)]
            if card.figure is None and s.get("figure") and (results / s["name"] / s["figure"]).is_file():
                card.figure = results / s["name"] / s["figure"]
        out.append(card)
    return out


def _effect(e: dict) -> str:
    if e["effect"] is None:
        return "no measurement"
    spread = "" if e["spread"] is None else f" ± {e['spread']:.3g}"
    paper = "" if e["paper_effect"] is None else f" (paper: {e['paper_effect']})"
    return f"{e['effect']:+.4g}{spread} {e['metric']}{paper}"


def _why(e: dict) -> str:
    """The premises behind the verdict: the failed ones for an untested entry, else every one that held."""
    bad = ledger_rules.failed(e["premises"])
    shown = bad or e["premises"]
    return "; ".join(f"{p['name']}: {ledger_rules._short(p['value'])}" for p in shown)


def markdown(cs: list[Card]) -> str:
    parts = []
    for c in cs:
        parts.append(f"### {c.title}\n\n{c.sources}\n")
        if not c.rows:
            parts.append("no committed study yet\n")
        for study, e in c.rows:
            why = _why(e)
            parts.append(f"- **{e['verdict']}**: {e['claim']}: {_effect(e)}; {ledger_rules.regime_text(e['regime'])}"
                         + (f"; premises: {why}" if why else "") + f" ({study})")
    return "\n".join(parts)


def render_html(cs: list[Card]) -> str:
    out = []
    for c in cs:
        rows = []
        for study, e in c.rows:
            v = verdict_of(e)
            why = _why(e)
            rows.append(f"<li><span class='verdict' style='background:{COLORS.get(v, '#57606a')}'>"
                        f"{html.escape(v)}</span> {html.escape(e['claim'])}<br><small>{html.escape(_effect(e))}; "
                        f"{html.escape(ledger_rules.regime_text(e['regime']))}"
                        + (f"; premises: {html.escape(why)}" if why else "") + f" ({html.escape(study)})</small>"
                        + (f"<br><small>{html.escape(e['verdict'])}</small>" if v == ledger_rules.UNTESTED else "")
                        + "</li>")
        fig = ""
        if c.figure is not None:
            data = base64.b64encode(c.figure.read_bytes()).decode()
            fig = f"<img alt='{html.escape(c.figure.stem)}' src='data:image/png;base64,{data}'>"
        body = f"<ul>{''.join(rows)}</ul>" if rows else "<p>no committed study yet</p>"
        out.append(f"<section class='card' id='card-{c.key}'><h3>{html.escape(c.title)}</h3>"
                   f"<p class='sources'>{html.escape(c.sources)}</p>{body}{fig}</section>")
    return f"<div class='cards'>{''.join(out)}</div>"


STYLE = (".cards{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:1em;margin:1em 0}"
         ".card{border:1px solid #d0d7de;border-radius:8px;padding:.6em 1em;font-size:.85em;overflow:hidden}"
         ".card h3{margin:.2em 0}.card ul{padding-left:1.1em;margin:.4em 0}.card li{margin:.3em 0}"
         ".card img{max-width:100%;max-height:11em;display:block;margin:.4em auto 0}"
         ".sources{color:#57606a;margin:0}.verdict{color:#fff;border-radius:4px;padding:0 .35em;font-size:.9em}"
         "details{margin:.5em 0}summary{cursor:pointer;font-weight:bold}")
