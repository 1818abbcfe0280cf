"""No words about how the project was built where a user reads: the README, docs/, the studies' READMEs, the
profiles and the DAG's files (configs/*.yaml, tests/micro_params.yaml, dvc.yaml, pyproject.toml, .dvc/config), and the
prose of the code (docstrings, comments, strings: help texts and messages) of src/, stages/, flows/ and benchmarks/.

A reader of a page or a --help has no access to the tracker, the sessions or the people that made it, and no use for
a module's former name: an issue number, a working session, other engineers, "(was x.py)" or a CI run's name says
nothing to them. Nor do documents outside the repository: every page and docstring states its method in its own words
instead of pointing at a specification the reader cannot open. Code itself (identifiers) is not prose: a variable
named `METHODS` is fine, the words "METHODS §A" in its docstring are not.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# pattern -> what it is (the failure message says why it does not belong)
BUILD_WORDS: dict[str, str] = {
    r"\bissues?\s*#?\d+": "an issue number",
    r"\bissue\s+\"": "a named issue",
    r"\b(?:the|this|that)\s+issue\b": "the tracker's task",
    r"(?<!-)\bitems?\s+\d+\b": "an item of a task",  # not a flag: `--items 6`
    r"\b(?:this|that|the|a|our|my|previous|earlier|next|one|each)\s+sessions?\b|\bsession's": "a working session",
    r"\bengineers?\b": "the people who built it",
    r"\bhelpers?\s+[A-Z]\b": "the people who built it",
    r"\((?:was|formerly)\s[^)]*\)": "a former name",
    r"\bci\d+\b": "a CI run's name",
    r"\b(?:tonight|yesterday|this morning|last night)\b": "when it was built",
    r"(?-i:\bMETHODS\b|\bDESIGN\b|\bCONTRACT\b)|\b(?:METHODS|DESIGN|CONTRACT)\.md\b": "a document outside the repository",
}
PATTERN = re.compile("|".join(f"(?P<w{i}>{p})" for i, p in enumerate(BUILD_WORDS)), re.I)
WHAT = list(BUILD_WORDS.values())


def files(root: Path = ROOT) -> list[Path]:
    found = [root / "README.md", *sorted((root / "docs").rglob("*.md")), *sorted(root.glob("results/*/README.md")),
             *sorted((root / "configs").glob("*.yaml")), root / "tests" / "micro_params.yaml", root / "dvc.yaml",
             root / "pyproject.toml", root / ".dvc" / "config"]
    for folder in ("src", "stages", "flows", "benchmarks"):
        found += sorted(p for p in (root / folder).rglob("*.py") if "egg-info" not in str(p))
    return found


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of what a reader reads in a file: all of a page; a Python file's comments and strings."""
    text = path.read_text()
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            for i, line in enumerate(tok.string.splitlines()):
                out.append((tok.start[0] + i, line))
    return out


def build_words(path: Path) -> list[tuple[int, str, str]]:
    """(line, the words, what they are) of every build-process word in `path`'s prose."""
    hits = []
    for line, text in prose(path):
        for m in PATTERN.finditer(text):
            kind = WHAT[int(next(k for k, v in m.groupdict().items() if v)[1:])]
            hits.append((line, m[0], kind))
    return hits


@pytest.mark.parametrize("path", files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_words_about_how_the_project_was_built(path):
    hits = build_words(path)
    assert not hits, f"{path.relative_to(ROOT)}: words about how it was built, which its reader cannot use:\n" + \
        "\n".join(f"  line {i}: {w!r} ({kind})" for i, w, kind in hits)


def test_the_check_flags_build_words_in_prose_not_in_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("As issue 19 measured, this session's run (was evaluate/optbench.py) per METHODS §A; helper C.\n"
                    "Seven other engineers' jobs ran; see DESIGN \"Claims\" and ci17. The issue asks for less.\n"
                    "Fine: a known problem, the open sessions of PostgreSQL, items: 200, `--items 6`, Methods and "
                    "design.\n")
    assert [w for _, w, _ in build_words(page)] == ["issue 19", "this session", "(was evaluate/optbench.py)",
                                                     "METHODS", "helper C", "engineers", "DESIGN", "ci17",
                                                     "The issue"]
    code = tmp_path / "mod.py"
    code.write_text('"""Claims (issue 22)."""\nMETHODS = ("a", "b")  # the methods\n'
                    'for m in METHODS:\n    print(f"see {m} and DESIGN")\n')
    assert [(i, w) for i, w, _ in build_words(code)] == [(1, "issue 22"), (4, "DESIGN")]
