"""Every committed ledger is what today's code derives from its study's committed raw metrics, and no entry claims
more than its run showed: a failed premise always reads "untested", never reproduced or contradicted.

The premises are what make a verdict testable (room to show the effect, the treatment acted, tuned hyperparameters
interior, a budget near the paper's for a claim about the paper's regime); the rule that applies them lives in
scalelab.analysis.claims alone, so switching it off is caught here by the regenerated ledgers (mutation checks)."""

import json
import math
from pathlib import Path

import pytest
from conftest import assert_same_ledger
from mutants import mutant, mutation_checks
from scalelab.analysis import claims, studies

RESULTS = Path(__file__).resolve().parents[1] / "results"
STUDIES = [f for f in sorted(RESULTS.iterdir()) if (f / studies.STUDY).is_file()]
# a study run in slices and not finished decides nothing: its ledger (if an older grid left one) is not read
IN_PROGRESS = [f for f in STUDIES if json.loads((f / studies.STUDY).read_text()).get("cells_missing")]
# a study whose spec decides no claim (a table, hd-cpt-start) has no ledger to regenerate
FOLDERS = [f for f in STUDIES if f not in IN_PROGRESS and "ledger" in json.loads((f / studies.STUDY).read_text())]
VERDICTS = {claims.REPRODUCED, claims.CONTRADICTED, claims.INCONCLUSIVE, claims.UNTESTED, "observation"}


def _ledger(folder: Path) -> list[dict]:
    meta = json.loads((folder / studies.STUDY).read_text())
    return claims.read_claims(folder / meta["ledger"])


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_the_committed_ledger_is_what_todays_code_derives_from_the_committed_cells(folder):
    assert_same_ledger(studies.regenerate(folder), _ledger(folder))


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_no_entry_claims_more_than_its_premises_allow(folder):
    for e in _ledger(folder):
        verdict = claims.verdict_of(e)
        assert verdict in VERDICTS, f"{e['id']}: verdict {e['verdict']!r}"
        assert set(e["regime"]) == set(claims.REGIME_FIELDS), f"{e['id']}: no regime"
        assert e["regime"]["paper"], f"{e['id']}: the paper's regime is not stated"
        bad = claims.failed(e["premises"])
        if bad:
            assert verdict == claims.UNTESTED, f"{e['id']}: premise {bad[0]['name']} failed but it is {verdict}"
            assert all(p["name"] in e["verdict"] for p in bad), e["verdict"]
        else:
            assert verdict != claims.UNTESTED, f"{e['id']}: untested with every premise holding"
        if e["regime"]["scope"] == "paper":
            assert any(p["name"] == "budget" for p in e["premises"]), f"{e['id']}: a paper-regime claim, no budget"
        if verdict == claims.REPRODUCED:
            assert e["spread"] is not None and e["n_seeds"] >= 2, f"{e['id']}: reproduced without an interval"


def test_a_study_in_progress_decides_nothing(tmp_path):
    """A study whose grid still has cells without a result is read as having no ledger, whatever file lies there:
    the decided table names it as in progress and takes none of its entries."""
    folder = tmp_path / "results" / "half-done"
    folder.mkdir(parents=True)
    entry = claims.observation("x", "a claim", "loss", 1.0, 1, "none", regime=claims.regime("test"), why="a test")
    claims.write_claims(folder / "claims_b.json", [entry])
    meta = {"name": "half-done", "profile": "p", "seeds": [0], "commit": "c", "command": "scalelab study half-done",
            "wall_time_s": 1.0, "ledger": "claims_b.json", "cells_missing": 3}
    (folder / studies.STUDY).write_text(json.dumps(meta))
    s = studies.read_study(folder)
    assert s["entries"] is None and s["problem"].startswith("in progress: 3 cells")
    assert "half-done: no ledger (in progress: 3 cells" in studies.decided_table(folder.parent)
    (folder / studies.STUDY).write_text(json.dumps({**meta, "cells_missing": 0}))
    assert studies.read_study(folder)["entries"] == [entry]


def test_the_ledger_check_reads_past_a_study_without_a_ledger(tmp_path, monkeypatch, capsys):
    """`python -m scalelab.analysis.studies` over every folder: a study whose spec decides no claim (no ledger, no
    generator, as hd-cpt-start) is named and passed, the studies after it are still checked (it raised ValueError
    at the first such folder), and a ledger that no generator can re-derive fails the check."""
    entry = claims.observation("x", "a claim", "loss", 1.0, 1, "none", regime=claims.regime("test"), why="a test")
    base = {"profile": "p", "seeds": [0], "commit": "c", "wall_time_s": 1.0}
    for name, extra in (("a-table", {}), ("b-ledger", {"ledger": "claims_b.json", "generator": "fake:ledger"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / studies.STUDY).write_text(json.dumps({"name": name, **base, **extra}))
    claims.write_claims(tmp_path / "b-ledger" / "claims_b.json", [entry])
    monkeypatch.setattr(studies, "generator", lambda spec: lambda folder: [entry])
    folders = [str(tmp_path / "a-table"), str(tmp_path / "b-ledger")]
    assert studies.main(folders) == 0
    out = capsys.readouterr().out
    assert "a-table: no ledger to regenerate" in out and "b-ledger: matches its committed ledger" in out, out
    assert studies.main(["--write", *folders]) == 0  # --write passes it too, and writes the others
    assert "b-ledger: wrote" in capsys.readouterr().out
    (tmp_path / "b-ledger" / studies.STUDY).write_text(json.dumps({"name": "b", **base, "ledger": "claims_b.json"}))
    assert studies.main(folders) == 1  # a ledger nothing re-derives is not passed as a table


def test_the_rule_applies_premises_before_the_interval():
    reg = claims.regime("0.12B, 20 tokens/param", params=10_000, tokens=2_600, paper_tokens_per_param=20,
                        scope="paper")
    strong = [0.3, 0.31, 0.29]
    room = claims.premise("room", 0.99, False, "the backbone closes <= 90% of the gap")
    assert claims.claim("x", "x", "nats", strong, "p", regime=reg)["verdict"] == claims.REPRODUCED
    assert claims.claim("x", "x", "nats", strong, "p", regime=reg, premises=[room])["verdict"] == "untested (room: 0.99)"
    budget = claims.budget_premise(reg, 10)
    assert not budget["passed"] and math.isclose(reg["ratio"], 0.013)
    assert claims.verdict_of(claims.claim("x", "x", "nats", [-0.3, -0.31, -0.29], "p", regime=reg,
                                          premises=[budget])) == claims.UNTESTED
    # size, not only sign: a real gain wholly below the smallest effect of interest is contradicted
    small = [0.010, 0.012, 0.011]
    assert claims.claim("x", "x", "nats", small, "p", regime=reg)["verdict"] == claims.REPRODUCED
    assert claims.claim("x", "x", "nats", small, "p", regime=reg, smallest_effect=0.05)["verdict"] == claims.CONTRADICTED
    assert claims.claim("x", "x", "nats", [0.0, 0.1, 0.05], "p", regime=reg,
                        smallest_effect=0.05)["verdict"] == claims.INCONCLUSIVE
    # an external interval: no interval (a bound) is never a verdict
    assert claims.interval_claim("x", "x", "x", 2.0, None, 3, "bound", "p", regime=reg)["verdict"].startswith(
        claims.INCONCLUSIVE)
    with pytest.raises(ValueError, match="regime"):
        claims.claim("x", "x", "nats", strong, "p", regime=None)


def test_the_decided_table_groups_by_verdict_and_names_the_failed_premise(tmp_path):
    reg = claims.regime("paper regime", params=1_000_000, tokens=2_000_000)
    entries = [claims.claim("a.win", "none is worse", "nats", [0.07, 0.08, 0.06], "p", regime=reg),
               claims.claim("a.lose", "wd helps", "nats", [-0.07, -0.08, -0.06], "p", regime=reg),
               claims.claim("a.untested", "wd_in helps", "nats", [-0.07, -0.08, -0.06], "p", regime=reg,
                            premises=[claims.premise("γ moved", 0.001, False, "mean γ shrinks by > 1%")]),
               claims.claim("a.flat", "flat", "nats", [0.07, -0.08, 0.01], "p", regime=reg)]
    for name, superseded in (("s1", None), ("s0-old", "old code")):
        folder = tmp_path / name
        claims.write_claims(folder / "claims_a.json", entries)
        (folder / "study.json").write_text(json.dumps(
            {"name": name, "profile": "p", "seeds": [0, 1, 2], "commit": "abcdef0", "command": "c",
             "wall_time_s": 1, "ledger": "claims_a.json"} | ({"superseded": superseded} if superseded else {})))
    table = studies.decided_table(tmp_path)
    lines = table.splitlines()
    assert lines.index("**Reproduced** (1)") < lines.index("**Contradicted** (1)") < lines.index(
        "**Untested: a premise failed** (1)")
    assert "| s1 | γ moved | 1 | 0.001 |" in table
    assert "s0-old (profile p, seeds 0, 1, 2, commit abcdef0): superseded (old code)" in table
    assert sum(" | s0-old |" in line for line in lines) == 0  # a superseded study decides nothing


@mutant("ledger-premises-ignored")
def _(monkeypatch):
    monkeypatch.setattr(claims, "untested_reason", lambda premises: None)


def _with_failed_premise(folder: Path) -> bool:
    try:
        return any(not p["passed"] for e in _ledger(folder) for p in e["premises"])
    except (ValueError, KeyError):  # a ledger in an older format: its regeneration test reports it
        return False


L = "tests/test_ledgers.py::"
test_switching_off_the_premises_is_caught = mutation_checks(
    [("ledger-premises-ignored", L + "test_the_rule_applies_premises_before_the_interval")]
    + [("ledger-premises-ignored", L + "test_the_committed_ledger_is_what_todays_code_derives_from_the_committed_"
        f"cells[{f.name}]") for f in FOLDERS if _with_failed_premise(f)])


def test_a_study_stopped_before_its_first_cell_ended_keeps_its_readme_blocks_for_later(tmp_path):
    """A first slice stopped before any cell finished has no params.yaml beside its cells, which every generator but
    the cells table reads (hd-cpt's gap table crashed the study command on it): those blocks wait, the cells table is
    written, and once the params are there the generator fills its block."""
    from scalelab.study import cells, ledger, spec

    root = RESULTS.parent
    study = spec.load(root, "hd-cpt")
    folder = tmp_path / "results" / "hd-cpt"
    cells.write_index(folder, [])
    gap = "<!-- generated by scalelab.analysis.hd_start:gap_table from results/hd-cpt/cells --><!-- end -->"
    table = "<!-- generated by scalelab.study.ledger:cells_table from results/hd-cpt/cells/index.json --><!-- end -->"
    (folder / "README.md").write_text(f"# hd-cpt\n\n{table}\n\n{gap}\n")
    text = ledger.refresh_readme(study, tmp_path).read_text()
    assert gap in text and table not in text and "| stage | cells |" in text
    (folder / "params.yaml").write_text((root / "configs" / "hd-cpt.yaml").read_text())
    text = ledger.refresh_readme(study, tmp_path).read_text()
    assert gap not in text and "| cell | tokens | loss(cell) − loss(n = 1)" in text


def test_study_json_names_short_params_and_the_spec_for_long_ones(tmp_path):
    """study.json's `profile` (what every table naming the study prints) lists a spec's params when they are short, and
    names the spec file when they are not: hd-parity-hints-8k's cells, listed whole, made one line of the README's
    decided table over a thousand characters."""
    from scalelab.study import ledger, spec

    root = RESULTS.parent
    long = spec.load(root, "hd-parity-hints-8k")
    short = long.__class__(**{**vars(long), "params": {"hidden_decoding.train.max_steps": 8000}})
    profile = "configs/hd-parity-hints.yaml with "
    for study, want in ((short, profile + "hidden_decoding.train.max_steps=8000"),
                        (long, profile + "the params of configs/studies/hd-parity-hints-8k.yaml")):
        (tmp_path / "results" / study.name).mkdir(parents=True, exist_ok=True)
        ledger.update_study_json(study, tmp_path, [], ran=True)
        assert json.loads((tmp_path / "results" / study.name / "study.json").read_text())["profile"] == want
