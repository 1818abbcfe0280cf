"""The report: one markdown file and the same as a static HTML page (PNGs embedded as base64, readable offline).

Everything in it is computed from the pipeline's outs, nothing is typed in: the scale-vector ablation and scaling fits
(data/scaling), the optimizer leaderboard, Hidden Decoding's gain against n and the compression table (each method's
summary folder: its CSV tables and PNG plots), the evaluation table (metrics/evaluate), the loss curves overlaying the
variants of each size (plots/pretrain), and the claims ledger gathered from metrics/claims_<a|b|c|d>.json, each claim
beside its published number. A method whose outs are absent is reported as "not run".

Beside this run's ledger (one seed in the default profile, so mostly inconclusive by design) stand the committed
studies' ledgers from results/<study>/, each labelled with the profile, seeds and commit its study.json names (the
contract: docs/workflow.md "Committed studies"), so the first report says what is decided and by which run. A study
folder without that contract is listed as "no ledger" with the reason, never an error: this run's report goes on.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from scalelab.ledger import claims as ledger_rules
from scalelab.ledger import cards as first_screen
from scalelab.ledger import figures
from scalelab.ledger.claims import verdict_of
from scalelab.ledger.studies import committed_studies, studies_frame, study_label
from scalelab.ledger.tables import html_table, ledger_frame, md_table, published_notes


@dataclass(frozen=True)
class Method:
    key: str  # the claims file's letter
    title: str
    folder: str  # the method's summary out: every CSV there is a table, every PNG a figure


METHODS = (
    Method("a", "A. Scale vectors in normalization layers", "data/scaling"),
    Method("b", "B. Optimizers: the leaderboard", "data/optimizers/leaderboard"),
    Method("c", "C. Hidden Decoding: gain against n", "data/hidden_decoding_summary"),
    Method("d", "D. SigmaScale and SVD baselines: compression", "data/compress_summary"),
)
CLAIMS = "metrics/claims_{key}.json"
HD_GAIN = ("plots/hidden_decoding_gain.csv", "n_streams", "gain_tokens")  # the Hidden Decoding summary's plot data
RESULTS = "results"

# ("h1"|"h2"|"h3"|"p", text) ("table", DataFrame) ("img", Path) ("ledger", entries) ("cards", [Card]),
# ("details", (summary, [Block])): folded in the HTML page, inline in the markdown
Block = tuple[str, Any]


def render_markdown(blocks: list[Block], out_dir: Path) -> str:
    parts = []
    for kind, x in blocks:
        if kind in ("h1", "h2", "h3"):
            parts.append("#" * int(kind[1]) + " " + x)
        elif kind == "p":
            parts.append(x)
        elif kind == "table":
            parts.append(md_table(x))
        elif kind == "ledger":  # whole (a ledger has no CSV beside it), each published statement once below it
            parts.append(md_table(ledger_frame(x), max_rows=None) + "\n\nPublished:\n\n"
                         + "\n".join(f"{i}. {text}" for i, text in enumerate(published_notes(x), 1)))
        elif kind == "img":
            parts.append(f"![{x.stem}]({os.path.relpath(x, out_dir)})")
        elif kind == "cards":
            parts.append(first_screen.markdown(x, out_dir))
        elif kind == "details":
            parts.append(f"**{x[0]}**\n\n" + render_markdown(x[1], out_dir).rstrip("\n"))
    return "\n\n".join(parts) + "\n"


def _html_blocks(blocks: list[Block]) -> str:
    parts = []
    for kind, x in blocks:
        if kind in ("h1", "h2", "h3"):
            parts.append(f"<{kind}>{html.escape(x)}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{html.escape(x)}</p>")
        elif kind == "table":
            parts.append(html_table(x))
        elif kind == "ledger":
            notes = "".join(f"<li>{html.escape(text)}</li>" for text in published_notes(x))
            parts.append(f"{html_table(ledger_frame(x), max_rows=None)}<p>Published:</p>"
                         f"<ol class='published'>{notes}</ol>")
        elif kind == "img":
            data = base64.b64encode(x.read_bytes()).decode()
            parts.append(f'<figure><img alt="{html.escape(x.stem)}" src="data:image/png;base64,{data}"></figure>')
        elif kind == "cards":
            parts.append(first_screen.render_html(x))
        elif kind == "details":
            parts.append(f"<details><summary>{html.escape(x[0])}</summary>{_html_blocks(x[1])}</details>")
    return "".join(parts)


def render_html(blocks: list[Block], title: str) -> str:
    style = ("body{font-family:sans-serif;max-width:70em;margin:1em auto;padding:0 1em}"
             "h1{font-size:1.5em;margin:.3em 0}"
             "table{border-collapse:collapse;margin:1em 0;font-size:.9em}"
             "td,th{border:1px solid #ccc;padding:.25em .5em;text-align:left}img{max-width:100%}"
             + first_screen.STYLE)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{_html_blocks(blocks)}</body></html>\n")


def gather_claims(root: Path) -> dict[str, list[dict] | None]:
    """Each method's ledger entries (read and checked by claims.read_claims), None where its file is absent."""
    out = {}
    for m in METHODS:
        path = root / CLAIMS.format(key=m.key)
        out[m.key] = ledger_rules.read_claims(path) if path.is_file() else None
    return out


def evaluation_table(root: Path, names: list[str]) -> pl.DataFrame | None:
    rows = []
    for name in names:
        path = root / "metrics/evaluate" / f"{name}.json"
        if path.is_file():
            m = json.loads(path.read_text())
            lm = m.get("lm_eval", {})
            rows.append({"model": name, "params": m["params"], "val_loss": m["val_loss"], "ppl": m["ppl"],
                         "bpb": m["bpb"], "continuation_acc": m["continuation_acc"],
                         "continuation_stderr": m["continuation_stderr"], "cloze_acc": m["cloze_acc"],
                         "cloze_stderr": m["cloze_stderr"], "chance": m["chance"], "tokens_per_s": m["tokens_per_s"],
                         "peak_mem_mb": m["peak_mem_mb"],
                         "lm_eval": "skipped" if "skipped" in lm else json.dumps(lm.get("results", {}))})
    return pl.DataFrame(rows) if rows else None


def curve_table(root: Path, cells: list[dict]) -> pl.DataFrame | None:
    """Validation points of every pretrain cell's curve (plots/pretrain/<cell>.csv), long format."""
    frames = []
    for c in cells:
        path = root / "plots/pretrain" / f"{c['name']}.csv"
        if path.is_file():
            df = pl.read_csv(path).filter(pl.col("val_loss").is_not_null())
            frames.append(df.select("step", "tokens", "val_loss").with_columns(
                pl.lit(c["variant"]).alias("variant"), pl.lit(c["size"]).alias("size"), pl.lit(c["seed"]).alias("seed")))
    return pl.concat(frames) if frames else None


def ablation_table(root: Path) -> pl.DataFrame | None:
    """Final validation loss per variant and size (base recipe, mean over seeds) and its difference to `standard`."""
    path = root / "data/scaling/summary.csv"
    if not path.is_file():
        return None
    s = pl.read_csv(path)
    if "recipe" in s.columns:
        s = s.filter(pl.col("recipe") == "base")
    std = s.filter(pl.col("variant") == "standard").select("size", pl.col("val_loss").alias("standard"))
    return (s.join(std, on="size", how="left").with_columns((pl.col("val_loss") - pl.col("standard"))
            .alias("delta_vs_standard")).select("variant", "size", "val_loss", "delta_vs_standard",
                                                *[c for c in ("val_loss_std", "seeds") if c in s.columns]))


def build(root: Path, out: Path, *, cells: list[dict], eval_names: list[str], plots_csv: Path,
          pretrained: list[str] = ()) -> dict[str, Any]:
    """Write out/{report.md, report.html, *.png} and plots_csv (curves for `dvc plots`); return the report's metrics.
    `pretrained`: the pretrained models this run imported (named in the line that says what the run is)."""
    root, out = Path(root), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    studies = committed_studies(root / RESULTS)
    seeds = sorted({c["seed"] for c in cells})
    blocks: list[Block] = [
        ("h1", "scalelab report"),
        ("p", "What the committed studies (results/) decided, one card per paper: each verdict with the premises "
              "and regime behind it. Generated from the pipeline's outs; nothing in it is typed in."),
        ("cards", first_screen.cards(studies, root / RESULTS, out))]
    claims = gather_claims(root)
    verdicts = Counter(verdict_of(e) for entries in claims.values() if entries for e in entries)
    real = f", the pretrained {', '.join(pretrained)}" if pretrained else ""
    blocks += [("p", f"This run: a smoke-scale run of every phase on this profile ({os.cpu_count()} CPU cores here, "
                     f"{len(seeds)} seed{'' if len(seeds) == 1 else 's'}, {len(cells)} pretrain cells of tiny models"
                     f"{real}, reduced grids), sized to show that the pipeline works, not to decide: its ledger reads "
                     + (", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) or "no claims files yet") + ".")]
    blocks += [("h2", "This run's claims ledger")]
    for m in METHODS:
        body: list[Block] = ([("p", f"This run: {CLAIMS.format(key=m.key)}. Rule: {claims[m.key][0]['rule']}"),
                              ("ledger", claims[m.key])] if claims[m.key]
                             else [("p", f"not run ({CLAIMS.format(key=m.key)} absent)")])
        blocks += [("details", (m.title, body))]
    if studies:
        blocks += [("h2", "Committed studies"), ("table", studies_frame(studies))]
        blocks += [("details", (f"{s['name']}: every entry", [
            ("p", f"Committed study {study_label(s)}: results/{s['name']}/{s['ledger']}, made by `{s['command']}`"),
            ("ledger", s["entries"])])) for s in studies if s["entries"] is not None]

    evals = evaluation_table(root, eval_names)
    blocks += [("h2", "Evaluation")]
    if evals is None:
        blocks += [("p", "not run (no metrics/evaluate/*.json for the models in params)")]
    else:
        blocks += [("p", f"Perplexity on the fixed validation windows; zero-shot multiple choice built from the "
                         f"validation split ({int(evals['chance'][0] ** -1)} choices, chance "
                         f"{float(evals['chance'][0]):.2f}); forward tokens/s and peak memory."),
                   ("table", evals), ("img", figures.evaluation(evals, out / "evaluation.png"))]

    curves = curve_table(root, cells)
    if curves is not None:
        plots_csv.parent.mkdir(parents=True, exist_ok=True)
        tmp = plots_csv.with_name(f".{plots_csv.name}.tmp")
        curves.sort("size", "variant", "seed", "step").write_csv(tmp)
        tmp.replace(plots_csv)  # atomic: `dvc plots` never reads half a file
        blocks += [("h2", "Loss curves")]
        blocks += [("img", figures.loss_curves(curves, size, out / f"loss_{size}.png"))
                   for size in curves["size"].unique(maintain_order=True)]

    for m in METHODS:
        folder = root / m.folder
        blocks += [("h2", m.title)]
        if m.key == "a" and (abl := ablation_table(root)) is not None:
            blocks += [("table", abl), ("img", figures.ablation(abl, out / "ablation.png"))]
        if m.key == "c" and (gain := root / HD_GAIN[0]).is_file():
            g = pl.read_csv(gain)
            if {HD_GAIN[1], HD_GAIN[2]} <= set(g.columns):
                blocks += [("img", figures.gain_vs_n(g.sort(HD_GAIN[1]), HD_GAIN[1], HD_GAIN[2], out / "hd_gain.png"))]
        if not folder.is_dir():
            blocks += [("p", f"not run ({m.folder} absent)")]
            continue
        blocks += [("details", (f"{m.folder}/{csv.name}", [("table", pl.read_csv(csv))]))
                   for csv in sorted(folder.glob("*.csv"))]
        blocks += [("img", png) for png in sorted(folder.glob("*.png"))]

    (out / "report.md").write_text(render_markdown(blocks, out))
    (out / "report.html").write_text(render_html(blocks, "scalelab report"))
    return {"claims": {m.key: (dict(Counter(e["verdict"].split(" (")[0] for e in claims[m.key]))
                               if claims[m.key] else "not run") for m in METHODS},
            "verdicts": dict(verdicts),
            "studies": {s["name"]: dict(Counter(map(verdict_of, s["entries"]))) if s["entries"] is not None
                        else "no ledger" for s in studies},
            "models_evaluated": 0 if evals is None else evals.height,
            "sections_run": [m.key for m in METHODS if (root / m.folder).is_dir()]}
