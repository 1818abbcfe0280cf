"""Cells keyed on the code they run (scalelab.runtime.code): each stage's dvc.yaml deps are the code its script
imports, a checkpoint's digest the code its trainer imports, so an edit to one paper's package stales only that
paper's cells and an edit to the shared core stales every cell that runs it."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest
from conftest import ROOT

from scalelab.runtime import code
from scalelab.runtime import yamlio

PAPERS = ("scale_vectors", "optbench", "hidden_decoding", "compress")  # one package per paper (docs/architecture.md)


def stages() -> dict[str, tuple[str, list[str]]]:
    """Each dvc.yaml stage run by a script of stages/: (that script, its deps as written)."""
    out = {}
    for name, st in yamlio.safe_load((ROOT / "dvc.yaml").read_text())["stages"].items():
        body = st.get("do", st)
        if m := re.search(r"python (stages/\w+\.py)", body["cmd"]):
            out[name] = (m[1], [str(d) for d in body.get("deps") or []])
    return out


def wanted(script: str) -> list[str]:
    """The src deps a stage needs: the script itself, each shared package it imports (whole: an edit anywhere in the
    shared core stales its cells) and each module of a paper's package it imports (one by one: a paper's summary code
    does not stale its training cells)."""
    out = set()
    for f in code.imported(ROOT / script):
        rel = f.relative_to(code.PACKAGE)
        out.add(f"src/scalelab/{rel}" if rel.parts[0] in PAPERS else f"src/scalelab/{rel.parts[0]}")
    return sorted(out)


@pytest.mark.parametrize("stage", sorted(stages()))
def test_each_stage_depends_on_exactly_the_code_it_imports(stage):
    script, deps = stages()[stage]
    assert script in deps, f"{stage}: its script {script} is no dep"
    got = sorted(d for d in deps if d.startswith("src/scalelab"))
    assert got == wanted(script), f"dvc.yaml {stage}: src deps should be {wanted(script)}"


def test_a_scale_vector_cell_depends_on_the_core_and_no_paper():
    script, deps = stages()["pretrain"]
    assert {"src/scalelab/model", "src/scalelab/train", "src/scalelab/optim"} <= set(deps)
    assert not [d for d in deps if any(d.startswith(f"src/scalelab/{p}") for p in PAPERS)], deps


@pytest.fixture
def package(tmp_path) -> Path:
    copy = tmp_path / "scalelab"
    shutil.copytree(code.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _edit(path: Path) -> None:
    path.write_text(path.read_text() + "\n# edited\n")


def test_an_edit_to_one_paper_stales_only_its_cells(package):
    """The digests a pretrain cell (train.fit), an optimizer-benchmark run (optbench.sweep) and a Hidden Decoding
    cell (hidden_decoding.train) resume under: an edit in the optimizer package moves the benchmark's alone, one in
    Hidden Decoding's model moves its cells' alone, one in the shared model core moves all three."""
    entries = ("scalelab.train.fit", "scalelab.optbench.sweep", "scalelab.hidden_decoding.train")

    def digests():
        return {e: code.digest(e, package=package) for e in entries}

    before = digests()
    assert len(set(before.values())) == 3
    _edit(package / "optbench" / "timing.py")
    after = digests()
    assert [e for e in entries if after[e] != before[e]] == ["scalelab.optbench.sweep"]
    _edit(package / "hidden_decoding" / "gate.py")
    again = digests()
    assert [e for e in entries if again[e] != after[e]] == ["scalelab.hidden_decoding.train"]
    _edit(package / "hidden_decoding" / "ledger.py")  # the summary's code: no cell of training runs it
    assert digests() == again
    _edit(package / "model" / "norm.py")
    last = digests()
    assert all(last[e] != again[e] for e in entries)
    _edit(package / "pipeline" / "warm.py")  # runs the stage, computes nothing of it (code.NEUTRAL)
    assert digests() == last


def test_imports_are_followed_wherever_they_sit(tmp_path):
    """Module-level, in-function, relative and `from package import module` imports are followed, each package's
    __init__ counts, and a name imported from a module is no module."""
    pkg = tmp_path / "scalelab"
    files = {
        "__init__.py": "",
        "a/__init__.py": "from scalelab.a.b import X\n",
        "a/b.py": "X = 1\ndef f():\n    from .c import g\n",
        "a/c.py": "from scalelab.d import e\ng = 0\n",
        "d/__init__.py": "",
        "d/e.py": "import scalelab.f.h  # noqa\n",
        "f/__init__.py": "",
        "f/h.py": "",
        "unused/__init__.py": "",
        "unused/x.py": "",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    got = {str(p.relative_to(pkg)) for p in code.imported("scalelab.a.b", package=pkg)}
    assert got == {"a/__init__.py", "a/b.py", "a/c.py", "d/__init__.py", "d/e.py", "f/__init__.py", "f/h.py"}


def test_a_digest_asked_again_follows_what_changed_since(tmp_path):
    """code.digest keeps what it followed between calls: a module that appears where a name was imported from (no
    file of the package changed), a new import, and an edit of the same size are each seen at the next call."""
    pkg = tmp_path / "scalelab"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("from scalelab.a import b\n")  # `b` a name of a/__init__, no module yet
    first = code.digest("scalelab.a", package=pkg)
    assert code.digest("scalelab.a", package=pkg) == first
    (pkg / "a" / "b.py").write_text("X = 1\n")  # now a module: followed
    second = code.digest("scalelab.a", package=pkg)
    assert second != first
    (pkg / "a" / "b.py").write_text("X = 2\n")  # the same size: its bytes are read at every call
    third = code.digest("scalelab.a", package=pkg)
    assert third != second
    (pkg / "c.py").write_text("")
    (pkg / "a" / "b.py").write_text("import scalelab.c\n")
    assert {p.name for p in code.imported("scalelab.a", package=pkg)} == {"__init__.py", "b.py", "c.py"}
    assert code.digest("scalelab.a", package=pkg) not in (first, second, third)
    fresh = hashlib.sha256()
    for f in code.imported("scalelab.a", package=pkg):  # what a first call in a new process computes
        fresh.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
    assert code.digest("scalelab.a", package=pkg) == fresh.hexdigest()[:16]
