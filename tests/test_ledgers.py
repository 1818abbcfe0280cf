"""Every committed ledger is what today's code derives from its study's committed raw metrics, and no entry claims
more than its run showed: a failed premise always reads "untested", never reproduced or contradicted.

The premises are what make a verdict testable (room to show the effect, the treatment acted, tuned hyperparameters
interior, a budget near the paper's for a claim about the paper's regime); the rule that applies them lives in
scalelab.ledger.claims alone, so switching it off is caught here by the regenerated ledgers (mutation checks)."""

import json
import math
from pathlib import Path

import pytest
from conftest import assert_same_ledger
from mutants import mutant, mutation_checks
from scalelab.ledger import claims, studies

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
        if verdict == "observation":  # measured, never decided: no smallest effect, no premises to decide by
            assert e["smallest_effect"] is None and e["sesoi"] is None and not e["premises"], e["id"]
            continue
        if e["regime"]["scope"] == "paper":
            assert any(p["name"] == "budget" for p in e["premises"]), f"{e['id']}: a paper-regime claim, no budget"
        if verdict == claims.REPRODUCED:
            assert e["spread"] is not None and e["n_seeds"] >= 2, f"{e['id']}: reproduced without an interval"
        # every claim carries its smallest effect (> 0) with its reason, and says when it was declared
        assert e["smallest_effect"] > 0 and tuple(e["sesoi"]) == claims.SESOI_FIELDS, e["id"]
        assert e["sesoi"]["reason"] and e["sesoi"]["declared"] in (claims.BEFORE, claims.POST_HOC), e["id"]
        if e["sesoi"]["declared"] == claims.POST_HOC and e["sesoi"]["depends_on_results"]:
            assert verdict != claims.CONTRADICTED, f"{e['id']}: contradicted by a post-hoc bound from its results"


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
    """`python -m scalelab.ledger.studies` over every folder: a study whose spec decides no claim (no ledger, no
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
    tiny, big = claims.Sesoi(0.005, "a test's"), claims.Sesoi(0.05, "a test's")
    room = claims.premise("room", 0.99, False, "the backbone closes <= 90% of the gap")
    assert claims.claim("x", "x", "nats", strong, "p", regime=reg, smallest_effect=tiny)["verdict"] == claims.REPRODUCED
    assert claims.claim("x", "x", "nats", strong, "p", regime=reg, premises=[room],
                        smallest_effect=tiny)["verdict"] == "untested (room: 0.99)"
    budget = claims.budget_premise(reg, 10)
    assert not budget["passed"] and math.isclose(reg["ratio"], 0.013)
    assert claims.verdict_of(claims.claim("x", "x", "nats", [-0.3, -0.31, -0.29], "p", regime=reg,
                                          premises=[budget], smallest_effect=tiny)) == claims.UNTESTED
    # size, not only sign: a real gain wholly below the smallest effect of interest is contradicted
    small = [0.010, 0.012, 0.011]
    assert claims.claim("x", "x", "nats", small, "p", regime=reg, smallest_effect=tiny)["verdict"] == claims.REPRODUCED
    assert claims.claim("x", "x", "nats", small, "p", regime=reg, smallest_effect=big)["verdict"] == claims.CONTRADICTED
    assert claims.claim("x", "x", "nats", [0.0, 0.1, 0.05], "p", regime=reg,
                        smallest_effect=big)["verdict"] == claims.INCONCLUSIVE
    # an external interval: no interval (a bound) is never a verdict
    assert claims.interval_claim("x", "x", "x", 2.0, None, 3, "bound", "p", regime=reg,
                                 smallest_effect=tiny)["verdict"].startswith(claims.INCONCLUSIVE)
    with pytest.raises(ValueError, match="regime"):
        claims.claim("x", "x", "nats", strong, "p", regime=None, smallest_effect=tiny)


def test_the_rule_refuses_a_claim_without_a_smallest_effect_of_interest():
    """No claim is decided without a smallest effect (> 0, with its reason): the error names the claim. With δ = 0 a
    null read inconclusive forever."""
    reg = claims.regime("paper regime")
    builders = {"claim": lambda **k: claims.claim("c.none", "x", "nats", [0.1, 0.2, 0.15], "p", regime=reg, **k),
                "interval": lambda **k: claims.interval_claim("c.none", "x", "x", 0.1, (0.05, 0.15), 3, "r", "p",
                                                              regime=reg, **k),
                "count": lambda **k: claims.count_claim("c.none", "x", "x", (3, 3), (0, 3), "p", regime=reg, **k)}
    for name, build in builders.items():
        for missing in ({}, {"smallest_effect": None}, {"smallest_effect": 0.05}):  # a bare number has no reason
            with pytest.raises(ValueError, match="claim 'c.none': no smallest effect of interest declared"):
                build(**missing)
        assert build(smallest_effect=claims.Sesoi(0.01, "a test's"))["smallest_effect"] == 0.01, name
    for bad in (0.0, -0.01, math.nan, math.inf):
        with pytest.raises(ValueError, match="must be a size > 0"):
            claims.Sesoi(bad, "a reason")
    with pytest.raises(ValueError, match="needs its reason"):
        claims.Sesoi(0.01, "  ")
    with pytest.raises(ValueError, match="must be a size > 0"):
        claims.decide(-0.1, 0.1, 0.0)


def test_an_interval_inside_the_smallest_effect_contradicts_unless_a_post_hoc_bound_rests_on_the_results():
    """An interval wholly inside ±δ reads contradicted where δ was declared before the cells ran, and where it was
    chosen after them on a reason that rests on no result of the study; a post-hoc δ measured on the study's own
    results cannot contradict (it could have been chosen to sit above the interval): inconclusive, saying why."""
    reg = claims.regime("paper regime")
    null = [0.001, -0.002, 0.0005]
    lo, hi = claims.t_interval(null)[1:]
    assert -0.01 < lo < hi < 0.01  # wholly inside ±δ

    def judged(sesoi: claims.Sesoi, study: str | None, diffs=null) -> dict:
        with claims.judging(study):
            return claims.claim("c.null", "x", "nats", diffs, "p", regime=reg, smallest_effect=sesoi)

    declared = claims.Sesoi(0.01, "a convention, measured on no study")
    e = judged(declared, "s1")
    assert e["verdict"] == claims.CONTRADICTED and e["sesoi"] == {
        "reason": declared.reason, "declared": claims.BEFORE, "depends_on_results": False}
    independent = claims.Sesoi(0.01, "the seed spread of a control in study s0", post_hoc_for=("s1",),
                               measured_on=("s0",))
    e = judged(independent, "s1")
    assert e["verdict"] == claims.CONTRADICTED and e["sesoi"]["declared"] == claims.POST_HOC
    assert not e["sesoi"]["depends_on_results"] and claims.sesoi_text(e) == "0.01 post hoc"
    # the same bound judging s0, whose results it was measured on, after s0's cells ran: it cannot contradict
    dependent = claims.Sesoi(0.01, "the seed spread of a control in study s0", post_hoc_for=("s0", "s1"),
                             measured_on=("s0",))
    e = judged(dependent, "s0")
    assert e["sesoi"] == {"reason": dependent.reason, "declared": claims.POST_HOC, "depends_on_results": True}
    assert claims.verdict_of(e) == claims.INCONCLUSIVE and claims.POST_HOC_DEPENDENT in e["verdict"]
    assert claims.sesoi_text(e) == "0.01 post hoc, from these results"
    computed = claims.Sesoi(0.01, "computed from the judged study's own cells", post_hoc_for=("s1",),
                            measured_on=("*",))
    assert claims.verdict_of(judged(computed, "s1")) == claims.INCONCLUSIVE
    # declared before the cells ran, a rule that computes δ from the study's own cells may contradict
    assert judged(computed, "s2")["verdict"] == claims.CONTRADICTED
    assert judged(computed, None)["sesoi"]["declared"] == claims.BEFORE  # a pipeline run: cells run after the code
    # the guard touches contradictions only: a clear gain still reproduces under a results-dependent post-hoc bound
    assert judged(dependent, "s0", [0.3, 0.31, 0.29])["verdict"] == claims.REPRODUCED
    # an external interval is guarded alike
    with claims.judging("s0"):
        e = claims.interval_claim("c.fit", "x", "x", 0.0, (lo, hi), 3, "r", "p", regime=reg, smallest_effect=dependent)
    assert claims.verdict_of(e) == claims.INCONCLUSIVE and claims.POST_HOC_DEPENDENT in e["verdict"]
    # non-inferiority: δ is the margin; the same null is no worse than the margin (reproduced), a clear loss beyond it
    # contradicts
    ni = lambda d: claims.claim("c.ni", "x", "nats", d, "p", regime=reg, smallest_effect=declared,  # noqa: E731
                                non_inferiority=True)["verdict"]
    assert ni(null) == claims.REPRODUCED and ni([-0.3, -0.31, -0.29]) == claims.CONTRADICTED
    assert ni([-0.02, 0.01, -0.005]) == claims.INCONCLUSIVE


def test_solve_or_fail_counts_are_decided_by_fishers_exact_test():
    """Solve-or-fail per seed: Fisher's exact test on the 2×2 counts, one-sided, at α = (1 − level)/2 (the one side of
    the two-sided t interval the other claims read). 3 of 3 against 0 of 3 is p = 1/C(6,3) = 0.05: not below 0.025,
    inconclusive; 5 of 5 against 0 of 5 is 1/C(10,5) = 0.004: reproduced; 1 of 3 against 0 of 3 is p = 0.5."""
    from math import comb

    from scipy.stats import fisher_exact

    reg = claims.regime("paper regime")
    sesoi = claims.Sesoi(0.5, "a test's solve rate")

    def count(t, c, level=0.95):
        return claims.count_claim("c.solve", "x", "solve rate", t, c, "p", level, regime=reg, smallest_effect=sesoi)

    for (t, c), p_exact in ((((3, 3), (0, 3)), 1 / comb(6, 3)), (((5, 5), (0, 5)), 1 / comb(10, 5)),
                            (((1, 3), (0, 3)), comb(3, 1) / comb(6, 1))):
        p = claims.fisher_greater(t, c)
        assert p == pytest.approx(p_exact) and p == pytest.approx(
            fisher_exact([[t[0], t[1] - t[0]], [c[0], c[1] - c[0]]], alternative="greater").pvalue)
        for level in (0.95, 0.9):
            e = count(t, c, level)
            assert claims.verdict_of(e) == (claims.REPRODUCED if p < (1 - level) / 2 else claims.INCONCLUSIVE), (t, c)
            assert f"Fisher p = {p:.3g}" in e["verdict"] and e["effect"] == pytest.approx(t[0] / t[1] - c[0] / c[1])
    assert claims.verdict_of(count((3, 3), (0, 3))) == claims.INCONCLUSIVE  # p = 0.05
    assert claims.verdict_of(count((5, 5), (0, 5))) == claims.REPRODUCED  # p = 0.004
    assert claims.verdict_of(count((1, 3), (0, 3))) == claims.INCONCLUSIVE  # p = 0.5
    # contradicted when the exact bound on the difference of rates lies below δ: no solve in 40 seeds of either arm
    # bounds the difference by 1 − 0.0125^(1/40) ≈ 0.10; at 3 seeds by 1 − 0.0125^(1/3) ≈ 0.77, above δ = 0.5
    none40, none3 = count((0, 40), (0, 40)), count((0, 3), (0, 3))
    assert none40["spread"] == pytest.approx(1 - 0.0125 ** (1 / 40)) and claims.verdict_of(none40) == claims.CONTRADICTED
    assert none3["spread"] == pytest.approx(1 - 0.0125 ** (1 / 3)) and claims.verdict_of(none3) == claims.INCONCLUSIVE
    # the t rule on the same per-seed outcomes would have read 3 of 3 against 0 of 3 as no seed variance


def test_the_decided_table_groups_by_verdict_and_names_the_failed_premise(tmp_path):
    reg = claims.regime("paper regime", params=1_000_000, tokens=2_000_000)
    d = {"regime": reg, "smallest_effect": claims.Sesoi(0.01, "a test's")}
    entries = [claims.claim("a.win", "none is worse", "nats", [0.07, 0.08, 0.06], "p", **d),
               claims.claim("a.lose", "wd helps", "nats", [-0.07, -0.08, -0.06], "p", **d),
               claims.claim("a.untested", "wd_in helps", "nats", [-0.07, -0.08, -0.06], "p", **d,
                            premises=[claims.premise("γ moved", 0.001, False, "mean γ shrinks by > 1%")]),
               claims.claim("a.flat", "flat", "nats", [0.07, -0.08, 0.01], "p", **d)]
    for name, superseded in (("s1", None), ("s0-old", "old code")):
        folder = tmp_path / name
        claims.write_claims(folder / "claims_a.json", entries)
        (folder / "study.json").write_text(json.dumps(
            {"name": name, "profile": "p", "seeds": [0, 1, 2], "commit": "abcdef0", "command": "c",
             "wall_time_s": 1, "ledger": "claims_a.json"} | ({"superseded": superseded} if superseded else {})))
    table = studies.decided_table(tmp_path)
    lines = table.splitlines()
    assert lines.index("**Reproduced** (1)") < lines.index("**Contradicted** (1)") < next(
        i for i, line in enumerate(lines) if line.startswith("**Untested: a premise failed** (1)"))
    assert "| s1 | γ moved | 1 | 0.001 |" in studies.untested_table(tmp_path)  # the untested claims' table
    assert "s0-old" not in studies.untested_table(tmp_path)  # a superseded study decides nothing
    assert "s0-old: superseded (old code)" in table
    assert sum(" | s0-old |" in line for line in lines) == 0  # a superseded study decides nothing


def test_the_readmes_decided_table_shows_a_few_rows_a_study_its_headline_first(tmp_path):
    """The README's summary (`decided_summary`): at most PER_STUDY rows of a study per verdict, those its study.json
    names as headline first, the rest counted and left to the whole table (docs/workflow.md's `decided_table`)."""
    reg = claims.regime("paper regime", params=1_000_000, tokens=2_000_000)
    d = {"regime": reg, "smallest_effect": claims.Sesoi(0.01, "a test's")}
    entries = [claims.claim(f"a.win{i}", f"claim {i} holds", "nats", [0.07, 0.08, 0.06], "p", **d) for i in range(5)]
    folder = tmp_path / "s1"
    claims.write_claims(folder / "claims_a.json", entries)
    (folder / "study.json").write_text(json.dumps(
        {"name": "s1", "profile": "p", "seeds": [0, 1, 2], "commit": "abcdef0", "command": "c", "wall_time_s": 1,
         "ledger": "claims_a.json", "headline": ["a.win4"]}))
    whole, summary = studies.decided_table(tmp_path), studies.decided_summary(tmp_path)
    assert sum("| claim " in line and "holds" in line for line in whole.splitlines()) == 5
    rows = [line.split(" | ")[0].removeprefix("| ") for line in summary.splitlines() if "holds" in line]
    assert rows == ["claim 4 holds", "claim 0 holds", "claim 1 holds"] and studies.PER_STUDY == 3
    assert "**Reproduced** (5)" in summary and "and 2 more, at most 3 a study shown here" in summary


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
    gap = "<!-- generated by scalelab.hidden_decoding.start:gap_table from results/hd-cpt/cells --><!-- end -->"
    table = "<!-- generated by scalelab.study.ledger:cells_table from results/hd-cpt/cells/index.json --><!-- end -->"
    (folder / "README.md").write_text(f"# hd-cpt\n\n{table}\n\n{gap}\n")
    text = ledger.refresh_readme(study, tmp_path).read_text()
    assert gap in text and table not in text and "| stage | cells |" in text
    from scalelab.config import profiles

    (folder / "params.yaml").write_text(profiles.complete_text(root / "configs" / "hd-cpt.yaml"))
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


def _registry_sesois() -> dict[str, claims.Sesoi]:
    """Every smallest effect the papers' claim registries declare, by its reason (what a ledger row carries)."""
    import importlib

    out = {}
    for module in ("scalelab.scale_vectors.claims", "scalelab.optbench.papers",
                   "scalelab.hidden_decoding.ledger", "scalelab.compress.ledger"):
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, claims.Sesoi):
                out[value.reason] = value
    return out


def _commit_time(sha: str):
    import subprocess
    from datetime import datetime

    done = subprocess.run(["git", "show", "-s", "--format=%cI", sha], cwd=RESULTS.parent, capture_output=True,
                          text=True)
    return datetime.fromisoformat(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda f: f.name)
def test_each_row_says_post_hoc_exactly_where_its_cells_ran_before_the_declaration(folder):
    """A row's smallest effect reads "post hoc" exactly where the earliest commit the study's cells ran at (study.json's
    `commit`) is older than the declaration (Sesoi.declared_on): typed lists of studies (`post_hoc_for`) are checked
    against git, so a study missing from one would read "declared before the cells ran" and fail here."""
    from datetime import datetime

    registry = _registry_sesois()
    meta = json.loads((folder / studies.STUDY).read_text())
    times = [_commit_time(c.strip()) for c in str(meta["commit"]).split(",")]
    if not times or None in times:
        pytest.skip(f"{meta['commit']}: not in this clone's history")
    ran = min(times)
    rows = [e for e in _ledger(folder) if e["sesoi"] is not None]
    assert rows, folder.name
    for e in rows:
        sesoi = registry.get(e["sesoi"]["reason"])
        assert sesoi is not None, f"{e['id']}: its smallest effect is declared in no claim registry"
        assert sesoi.declared_on, f"{e['id']}: the declaration of its smallest effect has no date"
        post_hoc = datetime.fromisoformat(sesoi.declared_on) > ran
        assert (e["sesoi"]["declared"] == claims.POST_HOC) == post_hoc, (e["id"], sesoi.declared_on, ran)
        assert set(sesoi.post_hoc_for) | set(sesoi.measured_on) - {"*"} <= {f.name for f in STUDIES}, sesoi
