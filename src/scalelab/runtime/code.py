"""The code a stage runs: the scalelab modules an entry point imports, and their digest.

A cell is keyed on the code it runs and no other: a pretrain cell on the model, optimizer and trainer core, not on
the optimizer benchmark's or Hidden Decoding's packages. `imported` follows every `import` of a scalelab module from
an entry (a module name, or a script's path such as stages/pretrain.py), at module level or inside a function, since
either runs that code in the cell; importing `a.b.c` also runs the `__init__` of `a` and `a.b`. It reads the source
(a regular expression), never imports it, so a check costs milliseconds and runs before any compute. `digest` is the sha256 of those
files: a run resumes from a checkpoint only under the code that wrote it (scalelab.train.trainer). dvc.yaml's deps
of each stage cover the same files (tests/test_pipeline.py checks them against `imported`), so DVC and a committed
study's cells (scalelab.study.grid) go stale on exactly those edits.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # src/scalelab
# What runs and records a stage but computes none of its results: the stage entry, checks and warm server
# (pipeline), MLflow records (tracking), threads and log lines (runtime), the package root. Held by their own tests,
# they key no cell: an edit to them would otherwise stale every cell of every study. Not followed either.
NEUTRAL = ("scalelab", "scalelab.pipeline", "scalelab.tracking", "scalelab.runtime")


def _file(name: str, package: Path) -> Path | None:
    """The source file of module `name` (dotted, from `scalelab`): a module, or a package's __init__."""
    rel = name.split(".")[1:]
    base = package.joinpath(*rel)
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return base.with_suffix(".py") if rel and base.with_suffix(".py").is_file() else None


# An import statement of a scalelab module, at any indentation (inside a function too): a regular expression over
# the source, ~50x faster than parsing it (ast), so the digest costs a cell milliseconds. A matching line inside a
# string would only add a dependency, never drop one.
IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+(\.+[\w.]*|scalelab[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]+)"
                    r"|import[ \t]+(scalelab[\w.]*))", re.M)


def _imports(path: Path, name: str | None) -> set[str]:
    """The scalelab modules `path` imports (dotted, and for `from m import x` each `m.x`, which is dropped later
    where x is no module); `name`: its own dotted name, for relative imports."""
    out: set[str] = set()
    for source, names, plain in IMPORT.findall(path.read_text()):
        if plain:
            out.add(plain)
            continue
        if source.startswith("."):
            if name is None:
                continue
            level = len(source) - len(source.lstrip("."))
            parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            module = ".".join([*parts[:len(parts) - level + 1], *([source.lstrip(".")] if source.strip(".") else [])])
        else:
            module = source
        out.add(module)
        for item in names.strip("()").replace("\n", " ").split(","):
            if item.strip():
                out.add(f"{module}.{item.split(' as ')[0].strip()}")
    return out


def imported(*entries: str | Path, package: Path = PACKAGE) -> list[Path]:
    """Every scalelab source file the entries import, transitively, sorted, but the NEUTRAL ones. An entry is a
    dotted module name (`scalelab.train.fit`) or the path of a script outside the package."""
    seen: dict[str, Path] = {}
    stack: list[str] = []
    for entry in entries:
        if isinstance(entry, Path) or str(entry).endswith(".py"):
            stack += sorted(_imports(Path(entry), None))
        else:
            stack.append(str(entry))
    while stack:
        name = stack.pop()
        if name in seen or name in NEUTRAL or name.rsplit(".", 1)[0] in NEUTRAL[1:]:
            continue
        path = _file(name, package)
        if path is None:
            continue  # a name imported from a module, not a module
        seen[name] = path
        parts = name.split(".")
        stack += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages above it run their __init__
        stack += sorted(_imports(path, name) - seen.keys())
    return sorted(set(seen.values()))


# (entries, package) -> (what the answer rests on, `imported`'s answer): a cell's config hash asks for the same
# digest at every run (an optimizer sweep's seeds stage ~50 times), and following the imports is ~90% of its ~20 ms
_FOLLOWED: dict[tuple, tuple[tuple, list[Path]]] = {}


def _stamp(package: Path, files: list[Path]) -> tuple:
    """The modification times of the package's folders (a module added, removed or renamed changes its folder's) and
    of each of `files` with its size: what `imported`'s answer for them rests on."""
    folders = []
    for folder, subdirs, _ in os.walk(package):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]  # rewritten by any import, read by none
        folders.append(os.stat(folder).st_mtime_ns)
    return tuple(folders), tuple((st.st_mtime_ns, st.st_size) for st in map(os.stat, files))


def digest(*entries: str, package: Path = PACKAGE) -> str:
    """sha256 (16 hex digits) of the files `entries` import, each named by its path in the package and its bytes.
    The files are followed again only when a folder of the package or one of them changed since the last call; their
    bytes are read at each."""
    key = (entries, package)
    try:
        stamp, files = _FOLLOWED[key]
        if _stamp(package, files) != stamp:
            raise KeyError(key)
    except (KeyError, OSError):  # first call, an edit, or a file gone
        files = imported(*entries, package=package)
        _FOLLOWED[key] = (_stamp(package, files), files)
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(package)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]
