"""Everything the README and docs/ name exists: links, paths, make targets, scalelab subcommands and flags, dvc stages,
script flags, params keys, library names, and every YAML and Python snippet loads (the rules: tests/docrefs.py).
And the other way round: every make target, scalelab subcommand and docs page is reachable from the README."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

import docrefs
from docrefs import ROOT, problems
from mutants import mutant, mutation_checks


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _names(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("page", pages(), ids=_names)
def test_everything_a_page_names_exists(page):
    found = problems(page.read_text(), page)
    assert not found, f"{_names(page)}: names what does not exist:\n" + "\n".join(f"  {p}" for p in found)


def _root_with_a_broken_makefile(tmp_path: Path) -> Path:
    """A tiny project: the real params.yaml and dvc.yaml, a Makefile whose `clean-outputs` is declared only."""
    for name in ("params.yaml", "dvc.yaml", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "Makefile").write_text(".PHONY: repro clean-outputs\nrepro: setup\n\tscalelab repro\n"
                                       "setup:\n\ttrue\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# here\n\ntext\n")
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "b.py").write_text("import argparse\nap = argparse.ArgumentParser()\n"
                                                  "ap.add_argument('--steps')\n")
    return tmp_path


GOOD = """# A page

See [here](here.md) and [the section](here.md#here); `benchmarks/b.py`, `data/pretrain/<cell>/model`,
`metrics/claims_<a|b>.json` (an out), `pretrain.max_steps`, `optim.<name>.lr`, `scalelab.ledger.claims:claim`.
Run `make repro` (`--workers` sets how many), `scalelab repro --workers 2 --target pretrain@unified-s-0`, `python benchmarks/b.py --steps 3`.

```bash
make repro WORKERS=1     # comment
scalelab check --params params.yaml && dvc repro compress_summary
pytest -m slow
```

```yaml
compress:
  grid: {methods: [svd], keep: [0.5], seeds: [0]}
```

```yaml
# machine.yaml
compress: {device: cuda}
```

```yaml
# ~/.config/dask/jobqueue.yaml
jobqueue: {slurm: {cores: 1}}
```

```yaml
# configs/studies/demo.yaml
profile: params.yaml
grid: [{stage: pretrain}]
seeds: [0]
```

```python
from scalelab.compress import register_for
```

## Filled

text
"""

# Each a broken variant of GOOD: what is replaced -> what replaces it, and the kind of problem it must raise.
BROKEN = [
    ("[here](here.md)", "[here](gone.md)", "link"),
    ("`benchmarks/b.py`", "`benchmarks/gone.py`", "path"),
    ("`data/pretrain/<cell>/model`", "`data/pretrained/<cell>/model`", "path"),
    ("`pretrain.max_steps`", "`pretrain.max_step`", "name"),
    ("`optim.<name>.lr`", "`optim.<name>.learning_rate`", "name"),
    ("scalelab.ledger.claims:claim", "scalelab.ledger.claims:claimz", "name"),
    ("`make repro`", "`make reproduce`", "make target"),
    ("`make repro`", "`make clean-outputs`", "make target"),  # declared, no recipe
    ("--workers 2", "--worker 2", "scalelab flag"),
    ("`scalelab repro", "`scalelab reproduce", "scalelab subcommand"),
    ("--target pretrain@", "--target pretrained@", "target"),
    ("b.py --steps 3", "b.py --step 3", "flag"),
    ("(`--workers` sets", "(`--wrokers` sets", "flag"),
    ("dvc repro compress_summary", "dvc repro compress_sumary", "dvc stage"),
    ("pytest -m slow", "pytest -m slowly", "pytest marker"),
    ("scalelab check --params", "scalelab check | report --params", "program"),
    ("compress:\n  grid:", "compress:\n  device: cuda\n  grid:", "yaml snippet"),  # a machine setting inline
    ("grid: {methods: [svd]", "grid: {methods: [svdd]", "yaml snippet"),
    ("compress: {device: cuda}", "compress: {methods: {}}", "yaml snippet"),  # not a machine setting
    ("keep: [0.5]", "keep: [0.5", "yaml snippet"),
    ("grid: [{stage: pretrain}]", "grid: [{stage: pretrained}]", "yaml snippet"),  # a study spec's stage
    ("profile: params.yaml", "profile: params.yml", "yaml snippet"),
    ("import register_for", "import register_four", "python snippet"),
    ("## Filled\n\ntext\n", "## Filled\n", "section"),
]


def test_the_check_flags_each_broken_name(tmp_path):
    root = _root_with_a_broken_makefile(tmp_path)
    page = root / "docs" / "page.md"
    assert [str(p) for p in problems(GOOD, page, root)] == []
    for old, new, kind in BROKEN:
        assert old in GOOD, old
        found = problems(GOOD.replace(old, new, 1), page, root)
        assert [p.kind for p in found] == [kind], (old, new, [str(p) for p in found])


def test_every_make_target_does_something_and_is_documented():
    targets = docrefs.make_targets()
    assert not [t for t, does in targets.items() if not does], "Makefile targets with no recipe"
    text = "\n".join(p.read_text() for p in pages())
    missing = [t for t in targets if not re.search(rf"make {re.escape(t)}\b", text)]
    assert not missing, f"make targets no page mentions (as `make TARGET`): {missing}"


def test_every_scalelab_subcommand_is_documented():
    text = "\n".join(p.read_text() for p in pages())
    missing = [c for c in docrefs.scalelab_commands() if c and not re.search(rf"scalelab {c}\b", text)]
    assert not missing, f"scalelab subcommands no page mentions: {missing}"


def test_every_docs_page_is_one_click_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = {(ROOT / t.split("#")[0]).resolve() for t in re.findall(r"\]\(([^)\s]+)\)", readme)}
    missing = [_names(p) for p in sorted((ROOT / "docs").rglob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_architecture_table_places_every_package_and_module():
    """docs/architecture.md's package table: a row per package of src/scalelab, and each module it names in
    parentheses (`stage`) is a module of that package."""
    text = (ROOT / "docs/architecture.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*) \|$", text, re.M))
    packages = {p.name for p in (ROOT / "src/scalelab").iterdir() if (p / "__init__.py").is_file()}
    assert set(rows) == packages, f"packages without a row {sorted(packages - set(rows))}, rows without a package " \
                                  f"{sorted(set(rows) - packages)}"
    misplaced = [f"{pkg}: {mod}" for pkg, what in rows.items() for mod in re.findall(r"`(\w+)`", what)
                 if not (ROOT / "src/scalelab" / pkg / f"{mod}.py").is_file()]
    assert not misplaced, f"modules named under a package that does not hold them: {misplaced}"


def test_params_yaml_comments_point_at_what_exists():
    """params.yaml's comments send a reader to pages, sections and files: those exist."""
    found = []
    for i, line in enumerate((ROOT / "params.yaml").read_text().splitlines(), 1):
        comment = line.split("#", 1)[1] if "#" in line else ""
        for m in docrefs.SECTION_REF.finditer(comment):
            target = ROOT / ("README.md" if m["file"] == "README" else m["file"])
            if not target.is_file() or m["title"] not in docrefs.section_titles(target):
                found.append(f"line {i}: {m['file']} \"{m['title']}\"")
        for token in re.findall(r"[\w./<>-]+/[\w./<>-]+", comment):
            token = token.rstrip(".")
            if docrefs.looks_like_path(token) and (why := docrefs.path_problem(token)):
                found.append(f"line {i}: {token}: {why}")
    assert not found, "params.yaml comments point at what does not exist:\n" + "\n".join(found)


@mutant("docrefs-paths-blind")
def _(monkeypatch):
    monkeypatch.setattr(docrefs, "path_problem", lambda token, root=ROOT: None)


@mutant("docrefs-snippets-unvalidated")
def _(monkeypatch):
    monkeypatch.setattr(docrefs, "yaml_problem", lambda body, root=ROOT: None)


@mutant("docrefs-flags-unchecked")
def _(monkeypatch):
    real = docrefs.scalelab_commands()
    monkeypatch.setattr(docrefs, "scalelab_commands", lambda: {k: v | {"--worker"} for k, v in real.items()})


T = "tests/test_docs_refs.py::"
test_the_docs_refs_checks_catch = mutation_checks([
    ("docrefs-paths-blind", T + "test_the_check_flags_each_broken_name"),
    ("docrefs-snippets-unvalidated", T + "test_the_check_flags_each_broken_name"),
    ("docrefs-flags-unchecked", T + "test_the_check_flags_each_broken_name"),
])

if __name__ == "__main__":  # list what every page names that does not exist
    for page in pages():
        for p in problems(page.read_text(), page):
            print(f"{_names(page)} {p}")
    sys.exit(0)
