"""docs/howto-rerun-a-study.md, its commands on the committed results: the ledger check the page names runs over a
study whose spec decides no claim (results/hd-cpt-start: it raised ValueError there) and a study with a ledger, and
every folder the page lists as having a spec is one `scalelab study` loads. The run itself, `--plan`, stale cells and
`--refresh`, and a run with nothing to run writing nothing, are tests/test_study.py's, on the micro study."""

from __future__ import annotations

import re

import docrefs
from scalelab.ledger import studies
from scalelab.study import spec

PAGE = docrefs.ROOT / "docs" / "howto-rerun-a-study.md"
RESULTS = docrefs.ROOT / "results"


def _listed(kind: str) -> list[str]:
    line = re.search(rf"^- {kind}: (.*)$", PAGE.read_text(), re.M)
    assert line, f"the page lists no folders {kind}"
    return re.findall(r"`([^`]+)`", line[1])


def test_the_ledger_check_the_page_names_passes_a_study_without_a_ledger(capsys, monkeypatch):
    assert "`python -m scalelab.ledger.studies`" in PAGE.read_text()
    monkeypatch.chdir(docrefs.ROOT)  # the page's command runs in the project folder
    # a study that has run (its study.json), without a ledger; a spec whose store was seeded before its first run has
    # no study.json yet
    table = [f for f in _listed("with a spec") if (RESULTS / f / studies.STUDY).is_file()
             and "ledger" not in (RESULTS / f / studies.STUDY).read_text()]
    assert table, "no committed study without a ledger left to check this on"
    assert studies.main([f"results/{table[0]}", "results/gamma-wd-dose"]) == 0
    out = capsys.readouterr().out
    assert f"results/{table[0]}: no ledger to regenerate" in out and "gamma-wd-dose: matches" in out, out


def test_the_folders_listed_with_a_spec_load_as_studies_and_the_others_have_none():
    with_spec, without = _listed("with a spec"), _listed("without")
    assert sorted(with_spec + without) == sorted(f.name for f in RESULTS.iterdir() if f.is_dir())
    for name in with_spec:
        assert spec.load(docrefs.ROOT, name).name == name
    assert not any((docrefs.ROOT / "configs" / "studies" / f"{n}.yaml").exists() for n in without)
