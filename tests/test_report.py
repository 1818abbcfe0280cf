"""The report: the ledger gathered from the methods' claims files (never typed), "not run" for absent methods, the
committed studies' ledgers beside this run's (labelled with profile, seeds and commit; a folder without the study
contract listed as "no ledger"), the evaluation table, curves overlaying the variants of a size, an offline HTML page;
dvc.yaml wires every claims file and results/."""

import base64
import importlib.util
import json
import re

import polars as pl
import pytest
import yaml
from conftest import MICRO, ROOT
from mutants import mutant, mutation_checks

from scalelab.ledger import claims, report
from scalelab.ledger.tables import ledger_frame, md_table
from scalelab.runtime import yamlio

REGIME = claims.regime("0.12B Llama, 20-80 tokens/param", params=1000, tokens=40, paper_tokens_per_param=20)


def _claim(*args, **kwargs):
    return claims.claim(*args, regime=REGIME, smallest_effect=claims.Sesoi(0.01, "a test's"), **kwargs)


CELLS = [{"name": f"{v}-s-base-{seed}", "variant": v, "size": "s", "seed": seed}
         for v in ("standard", "unified") for seed in (0, 1)]


def _eval_json(loss: float, acc: float) -> dict:
    return {"params": 1000, "val_loss": loss, "ppl": 2.718 ** loss, "bpb": loss / 0.69 / 3, "continuation_acc": acc,
            "continuation_stderr": 0.05, "cloze_acc": acc / 2, "cloze_stderr": 0.05, "chance": 0.25,
            "tokens_per_s": 1e4, "peak_mem_mb": 500.0, "lm_eval": {"skipped": "no tasks"}}


@pytest.fixture
def outs(tmp_path):
    """What the other stages would have written: scale-vector claims and summary, curves, evaluations."""
    entries = [_claim("a.unified", "unified beats standard", "val_loss", [0.03, 0.05, 0.04], "−0.05 (1.3B)"),
               _claim("a.none", "none is worse than standard", "val_loss", [-0.2, -0.25, -0.22], "+0.1"),
               _claim("a.wd_in", "decay on input scales helps", "val_loss", [0.01], "−0.01")]
    claims.write_claims(tmp_path / "metrics/claims_a.json", entries)
    (tmp_path / "data/scaling").mkdir(parents=True)
    pl.DataFrame({"recipe": ["base"] * 2, "variant": ["standard", "unified"], "size": ["s", "s"],
                  "val_loss": [3.0, 2.9]}).write_csv(tmp_path / "data/scaling/summary.csv")
    (tmp_path / "plots/pretrain").mkdir(parents=True)
    for c in CELLS:
        base = 3.0 if c["variant"] == "standard" else 2.9
        pl.DataFrame({"step": [1, 2, 3, 4], "tokens": [10, 20, 30, 40], "train_loss": [5.0, 4.0, 3.5, 3.2],
                      "val_loss": [None, base + 0.5, None, base + c["seed"] * 0.01]}).write_csv(
            tmp_path / f"plots/pretrain/{c['name']}.csv")
    (tmp_path / "metrics/evaluate").mkdir(parents=True)
    for c, loss in zip(CELLS, (3.0, 3.01, 2.9, 2.91)):
        (tmp_path / f"metrics/evaluate/{c['name']}.json").write_text(json.dumps(_eval_json(loss, 0.4)))
    return tmp_path, entries


def _study(root, name: str, entries: list[dict] | None, drop: str | None = None, ledger="metrics/claims_a.json"):
    """A committed study folder: study.json (without the field `drop`) and its ledger (None: no ledger file)."""
    folder = root / "results" / name
    folder.mkdir(parents=True)
    meta = {"name": name, "profile": "configs/cpu-study.yaml", "seeds": [0, 1, 2], "commit": "951c18e",
            "command": "make repro", "wall_time_s": 7692.0, "ledger": ledger}
    (folder / "study.json").write_text(json.dumps({k: v for k, v in meta.items() if k != drop}))
    if entries is not None:
        claims.write_claims(folder / ledger, entries)
    return folder


@pytest.fixture
def studies(tmp_path):
    """This run's scale-vector ledger (one seed) and results/: a decided study, four that break the contract."""
    root = tmp_path
    claims.write_claims(root / "metrics/claims_a.json",
                        [_claim("a.wd_in", "decay on input scales helps", "val_loss", [0.01], "−0.01")])
    decided = [_claim("base.none_hurts", "base: none is worse than standard", "val_loss", [0.07, 0.08, 0.06],
                            "+0.1"),
               _claim("base.none_hurts@s", "base: none is worse at size s", "val_loss", [0.07, 0.08, 0.06], "+0.1"),
               _claim("base.unified_helps", "base: unified is better", "val_loss", [0.01, -0.02, 0.015], "−0.05")]
    _study(root, "a-study", decided)
    _study(root, "b-no-seeds", decided, drop="seeds")
    _study(root, "c-no-ledger-file", None)
    _study(root, "d-bad-ledger-name", decided, ledger="metrics/ledger.json")
    (root / "results/e-in-progress").mkdir()  # a study being written: no study.json yet
    return root, decided


def test_the_report_shows_the_committed_studies_beside_this_run(studies):
    root, decided = studies
    m = report.build(root, root / "data/report", cells=CELLS, eval_names=[], plots_csv=root / "c.csv")
    md = (root / "data/report/report.md").read_text()
    label = "a-study (profile configs/cpu-study.yaml, seeds 0, 1, 2, commit 951c18e)"
    # the first screen: one card per paper, the committed study's decided claims with verdict and regime
    first = md[:md.index("This run: ")]
    card_a = first[first.index("### Scale vectors"):first.index("### Optimizers")]
    assert "1. **reproduced**: base: none is worse than standard (+0.07 ± " in card_a and "· a-study)" in card_a
    assert "base: unified is better" not in card_a  # inconclusive: not a headline when decided ones exist
    assert first.count("no committed study yet") == 3  # B, C, D have none here
    # a card whose study names no figure shows its rows drawn
    assert "![card_a](card_a.png)" in card_a and (root / "data/report/card_a.png").read_bytes()[:4] == b"\x89PNG"
    # then this run's ledger, then every committed study's ledger whole, labelled, each published statement once
    assert md.index("decay on input scales helps") < md.index(f"Committed study {label}")
    assert md_table(ledger_frame(decided), max_rows=None) in md and "made by `make repro`" in md
    ledger = md[md.index(f"Committed study {label}"):]
    assert [r.split(" | ")[-1] for r in ledger.splitlines()[4:7]] == ["[1] |", "[1] |", "[2] |"]
    assert ledger[ledger.index("Published:"):].startswith("Published:\n\n1. +0.1\n2. −0.05")
    assert m["studies"] == {"a-study": {"reproduced": 2, "inconclusive": 1}, "b-no-seeds": "no ledger",
                            "c-no-ledger-file": "no ledger", "d-bad-ledger-name": "no ledger",
                            "e-in-progress": "no ledger"}
    for why in ("no ledger: study.json lacks seeds", "no ledger: metrics/claims_a.json absent",
                "no ledger: ledger 'metrics/ledger.json' is not a path", "no ledger: study.json absent"):
        assert why in md, why
    page = (root / "data/report/report.html").read_text()
    assert "Committed study a-study (profile configs/cpu-study.yaml" in page


def test_a_reference_study_stays_in_the_tables_but_off_its_papers_card(tmp_path):
    from scalelab.ledger import cards, studies as committed

    small = [_claim("base.none_hurts", "base: none is worse than standard", "val_loss", [0.07, 0.08, 0.06], "+0.1")]
    near = [_claim("tuned.none_hurts@s", "tuned: none is worse at s", "val_loss", [0.05, 0.06, 0.04], "+0.1")]
    _study(tmp_path, "a-small-budget", small)
    _study(tmp_path, "b-paper-budget", near)
    meta = tmp_path / "results/a-small-budget/study.json"
    meta.write_text(json.dumps(json.loads(meta.read_text()) | {"reference": "a small budget"}))
    found = committed.committed_studies(tmp_path / "results")
    card = cards.cards(found, tmp_path / "results", tmp_path)[0]
    assert [study for study, _ in card.rows] == ["b-paper-budget"]
    assert "1 reproduced (reference: a small budget)" in committed.studies_table(tmp_path / "results")
    decided = committed.decided_table(tmp_path / "results")  # the README's: the study nearer the paper's regime
    assert "| tuned: none is worse at s |" in decided and "| base: none is worse" not in decided
    assert "a-small-budget: reference (a small budget); not in the tables (1 reproduced" in decided


def test_the_readme_table_lists_what_the_studies_decided(studies):
    from scalelab.ledger.studies import decided_table

    root, _ = studies
    table = decided_table(root / "results")
    rows = [r for r in table.splitlines() if r.startswith("| base")]
    half = claims.t_interval([0.07, 0.08, 0.06])[2] - 0.07
    assert rows == [f"| base: none is worse than standard | +0.0700 ± {half:.4f} | – | 0.01 | 3 | 0.001M params, 0.04 "
                    "tokens/param, paper 20 (small-scale) | a-study |"]  # per-size and inconclusive entries are counted, not listed
    assert "a-study (profile configs/cpu-study.yaml, seeds 0, 1, 2, commit 951c18e): 1 inconclusive, 1 reproduced" in table
    assert "e-in-progress: no ledger (study.json absent)" in table


def test_a_per_size_entry_without_a_pooled_one_is_the_claim(tmp_path):
    """The compression study decides `d.order.<a>.<b>@<ρ>` at one ρ and has no pooled `d.order.<a>.<b>`: those rows
    are its claims and are listed; a per-size row beside its pooled one is not."""
    from scalelab.ledger.studies import decided_table

    _study(tmp_path, "compression", [
        _claim("d.order.svd_llm.asvd@0.75", "SVD-LLM < ASVD at 0.75", "nats", [3.0, 3.2], "7.94 vs 11.14"),
        _claim("d.erank", "erank goes with loss", "rho", [0.5, 0.52], "qualitative"),
        _claim("d.erank@0.75", "erank goes with loss at 0.75", "rho", [0.5, 0.52], "qualitative")],
        ledger="metrics/claims_d.json")
    table = decided_table(tmp_path / "results")
    assert "| SVD-LLM < ASVD at 0.75 |" in table and "| erank goes with loss |" in table
    assert "at 0.75 | +" not in table.replace("SVD-LLM < ASVD at 0.75 | +", "")
    assert "**Reproduced** (2)" in table and ": 2 reproduced (every entry" in table


def test_report_gathers_the_ledger_and_says_what_did_not_run(outs):
    root, entries = outs
    out = root / "data/report"
    m = report.build(root, out, cells=CELLS, eval_names=[c["name"] for c in CELLS] + ["missing-model"],
                     plots_csv=root / "plots/report/val_loss_curves.csv")
    md = (out / "report.md").read_text()
    # the verdicts are the claims module's, from the effects: reproduced, contradicted, 1 seed inconclusive
    assert [e["verdict"] for e in entries] == ["reproduced", "contradicted", "inconclusive (1 seed)"]
    assert m["verdicts"] == {"reproduced": 1, "contradicted": 1, "inconclusive": 1}
    assert md_table(ledger_frame(entries), max_rows=None) in md  # the ledger, its published statements as notes
    assert md.count("−0.05 (1.3B)") == 1 and f"| {entries[0]['effect']:.4g} ± {entries[0]['spread']:.3g} |" in md
    assert m["claims"] == {"a": {"reproduced": 1, "contradicted": 1, "inconclusive": 1}, "b": "not run",
                           "c": "not run", "d": "not run"}
    assert md.count("not run (metrics/claims_") == 3 and "not run (data/compress_summary absent)" in md
    assert m["models_evaluated"] == 4 and "| standard-s-base-1 | 1000 | 3.01 |" in md
    # loss curves: validation points only, the variants of a size overlaid (both seeds kept for the band)
    curves = pl.read_csv(root / "plots/report/val_loss_curves.csv")
    assert curves.height == 8 and set(curves["variant"]) == {"standard", "unified"}
    assert (out / "loss_s.png").is_file() and "![loss_s](loss_s.png)" in md
    assert "| unified | s | 2.9 | -0.1 |" in md  # the ablation's Δ vs standard, computed from the scaling summary
    # the HTML page is self-contained: every image inline, nothing fetched
    page = (out / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == md.count("![") and all(base64.b64decode(i)[:4] == b"\x89PNG" for i in images)
    assert not re.search(r'(src|href)="(https?:)?//', page)


def test_a_malformed_claims_file_is_named(outs):
    root, _ = outs
    (root / "metrics/claims_c.json").write_text(json.dumps([{"id": "c1", "claim": "x"}]))
    with pytest.raises(ValueError, match="claims_c.json"):
        report.build(root, root / "out", cells=CELLS, eval_names=[], plots_csv=root / "c.csv")


def test_the_stage_logs_the_report_to_the_parent_run(outs, monkeypatch):
    root, _ = outs
    from mlflow import MlflowClient

    params = yamlio.safe_load(MICRO.read_text())
    params["pretrain"]["grid"] |= {"variants": ["standard", "unified"], "sizes": ["a"], "seeds": [0, 1]}
    params["evaluate"]["sizes"] = ["a"]
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(root)
    monkeypatch.setenv("SCALELAB_ROOT", str(root))
    # this test's own store, named for the stage and the client alike (not whatever an earlier test left set)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'mlflow.db'}")
    spec = importlib.util.spec_from_file_location("report_stage", ROOT / "stages/report.py")
    stage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stage)
    from scalelab.config import load_params

    stage.main(load_params("params.yaml"))
    run_id = json.loads((root / "data/report/mlflow_run.json").read_text())["run_id"]
    # by URI: a bare MlflowClient() resolves it through MLflow's process-wide state, which an earlier test in this
    # worker can leave changed (CI runs 3 and 4 found the run missing from the store it named)
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    parent = client.get_run(run_id).data.tags["mlflow.parentRunId"]
    logged = {a.path for a in client.list_artifacts(parent, "report")}
    assert {"report/report.md", "report/report.html"} <= logged
    assert json.loads((root / "metrics/report.json").read_text())["claims"]["a"]["reproduced"] == 1


def test_dvc_wires_every_claims_file_and_the_curves_plot():
    dvc = yamlio.safe_load((ROOT / "dvc.yaml").read_text())
    stages = dvc["stages"]

    def outs_of(stage):
        body = stage.get("do", stage)
        return [next(iter(o)) if isinstance(o, dict) else o
                for key in ("outs", "metrics", "plots") for o in body.get(key, [])]

    produced = {o for name, s in stages.items() if name != "report" for o in outs_of(s)}
    deps = set(stages["report"]["deps"])
    assert report.RESULTS in deps  # a committed study that lands reruns the report
    missing = sorted(o for o in produced if re.fullmatch(r"metrics/claims_[a-d]\.json", o) and o not in deps)
    missing += sorted(m.folder for m in report.METHODS if m.folder in produced and m.folder not in deps)
    assert not missing, f"add to the report stage's deps in dvc.yaml: {missing}"
    (plot,) = [p for p in dvc["plots"] if "plots/report/val_loss_curves.csv" in p]
    template = json.loads((ROOT / ".dvc/plots" / f"{plot['plots/report/val_loss_curves.csv']['template']}.json")
                          .read_text())
    assert template["spec"]["encoding"]["color"]["field"] == "variant"
    assert "plots/report/val_loss_curves.csv" in outs_of(stages["report"])


@mutant("report-ignores-studies")
def _(monkeypatch):
    monkeypatch.setattr(report, "committed_studies", lambda results: [])


@mutant("study-contract-unchecked")
def _(monkeypatch):
    from scalelab.ledger import studies as contract

    monkeypatch.setattr(contract, "STUDY_FIELDS", tuple(f for f in contract.STUDY_FIELDS if f != "seeds"))


test_the_study_checks_catch = mutation_checks([
    ("report-ignores-studies", "tests/test_report.py::test_the_report_shows_the_committed_studies_beside_this_run"),
    ("study-contract-unchecked", "tests/test_report.py::test_the_report_shows_the_committed_studies_beside_this_run"),
])


def _first_screen(page, expect: list[str]) -> list:
    """The cards of `page` in headless Chromium at a laptop's 1400x900: each card's title and verdicts on the first
    screen, before any table; its figure at the card's width and at its own size (not a thumbnail, not scaled)."""
    from test_ui import _browser

    browser = _browser()
    try:
        browser.set_window_size(1400, 900)
        browser.get(page.as_uri())
        height = browser.execute_script("return window.innerHeight")
        cards = browser.find_elements("css selector", "section.card")
        assert [c.get_attribute("id") for c in cards] == expect
        for c in cards:
            for part in c.find_elements("css selector", "h3, ol"):
                assert part.rect["y"] + part.rect["height"] <= height, f"{c.get_attribute('id')}: below the first screen"
            inner = browser.execute_script("return arguments[0].clientWidth - parseFloat(getComputedStyle(arguments[0])"
                                           ".paddingLeft) - parseFloat(getComputedStyle(arguments[0]).paddingRight)", c)
            for img in c.find_elements("css selector", "img"):
                natural = int(img.get_attribute("naturalWidth"))
                assert img.rect["width"] >= 0.95 * inner, (c.get_attribute("id"), img.rect["width"], inner)
                assert abs(natural - img.rect["width"]) <= 2, (c.get_attribute("id"), natural, img.rect["width"])
        first_table = browser.find_elements("css selector", "table")
        assert not first_table or first_table[0].rect["y"] >= cards[-1].rect["y"] + cards[-1].rect["height"]
        return [(c.text, len(c.find_elements("css selector", "img"))) for c in cards]
    finally:
        browser.quit()


def test_the_committed_studies_first_screen_in_a_browser(tmp_path):
    """The report of a fresh clone (results/ as committed, nothing run yet): a card per paper, each with its
    verdicts on a laptop's first screen and a figure drawn at the card's width."""
    (tmp_path / "results").symlink_to(ROOT / "results")
    report.build(tmp_path, tmp_path / "data/report", cells=[], eval_names=[], plots_csv=tmp_path / "c.csv")
    cards = _first_screen(tmp_path / "data/report/report.html", ["card-a", "card-b", "card-c", "card-d"])
    for text, images in cards:
        assert images == 1 and any(v in text for v in ("reproduced", "contradicted", "untested", "inconclusive"))


def test_the_first_screen_shows_a_card_per_paper_in_a_browser(studies):
    """The page as a reader opens it (headless Chromium, a laptop's 1400x900 window): the four papers' cards' verdicts
    are all on the first screen, each readable, before any of this run's tables."""
    root, _ = studies
    report.build(root, root / "data/report", cells=CELLS, eval_names=[], plots_csv=root / "c.csv")
    cards = _first_screen(root / "data/report/report.html", ["card-a", "card-b", "card-c", "card-d"])
    assert "reproduced" in cards[0][0] and "base: none is worse than standard" in cards[0][0]


def test_a_planned_study_without_a_slice_reads_not_started(tmp_path):
    from scalelab.ledger.studies import read_study

    (tmp_path / "results/planned").mkdir(parents=True)
    (tmp_path / "results/planned/README.md").write_text("# planned\n")
    assert read_study(tmp_path / "results/planned")["problem"] == "study.json absent"  # no spec: a broken folder
    (tmp_path / "configs/studies").mkdir(parents=True)
    (tmp_path / "configs/studies/planned.yaml").write_text("name: planned\n")
    s = read_study(tmp_path / "results/planned")
    assert s["entries"] is None and s["problem"].startswith("not started: `scalelab study planned` runs its spec")
