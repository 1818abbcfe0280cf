"""dvc.lock rewritten by splicing: the stages a `dvc repro` changed are dumped by DVC's own YAML dumper, every other
stage keeps its bytes from the file as read.

DVC updates dvc.lock after each stage by reading the whole file, updating that stage's entry and dumping the whole
file again through ruamel's pure-Python emitter: ~0.9 s for the default DAG's 86 stages (336 kB), every stage, under
the repo lock that the other cells' bookkeeping waits for. The emitter writes a top-level mapping's entries one after
another, each from its own data and its indentation alone (no anchors in DVC's plain data, so nothing crosses
entries): the bytes of an unchanged entry are the bytes it had when read. So the rewrite is the old text's blocks for
the unchanged stages and DVC's dump of `{"stages": {name: entry}}` for each changed or new one, in the dict's order;
anything else (another top-level key changed, a block the reader cannot find, an anchor in a dump) takes DVC's whole
dump, as before. tests/test_dvcrun.py checks the splice against the whole dump, byte for byte.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from typing import Any

ANCHOR = re.compile(r"(^|[\s:-])[&*][A-Za-z0-9_]+\b", re.M)


def stage_blocks(text: str) -> tuple[str, dict[str, str]] | None:
    """(the text before the first stage, {stage name: its block's text}) of dvc.lock as DVC writes it: the stages
    mapping last, at the top level, each entry's key line indented two spaces. None when the text is laid out
    otherwise."""
    head, sep, body = text.partition("\nstages:\n")
    if not sep or re.search(r"^\S", body, re.M):  # nothing after the stages at the top level
        return None
    # a stage's block opens with its key, indented two spaces; its values and any continuation line sit deeper
    starts = [m.start() for m in re.finditer(r"^  (?! )", body, re.M)]
    if not starts or starts[0] != 0:
        return None
    blocks = {}
    for a, b in zip(starts, [*starts[1:], len(body)], strict=True):
        block = body[a:b]
        key = block[2:block.index("\n")] if "\n" in block else ""
        if not key.endswith(":"):
            return None
        blocks[key[:-1]] = block
    return head + sep, blocks


def splice(text: str, old: dict[str, Any], new: dict[str, Any], dump: Callable[[Any, io.StringIO], Any]) -> str | None:
    """The new dvc.lock text: the unchanged stages' blocks of `text` (which `old` was parsed from), `dump`'s text of
    each stage changed or added in `new`. None when a splice cannot be sure to equal `dump(new)`."""
    rest = lambda data: [(k, v) for k, v in data.items() if k != "stages"]  # noqa: E731  in order: the head's bytes
    if rest(old) != rest(new):
        return None
    if list(new)[-1:] != ["stages"] or not isinstance(new["stages"], dict):
        return None
    parsed = stage_blocks(text)
    if parsed is None:
        return None
    head, blocks = parsed
    before = old.get("stages") or {}
    # a block is found by its key as the dumper wrote it: plain names only (a quoted key would not match `name:`)
    if set(blocks) != set(before):
        return None
    out = [head]
    for name, entry in new["stages"].items():
        if name in before and before[name] == entry:
            out.append(blocks[name])
            continue
        stream = io.StringIO()
        dump({"stages": {name: entry}}, stream)
        dumped = stream.getvalue()
        if not dumped.startswith("stages:\n") or ANCHOR.search(dumped):
            return None
        out.append(dumped[len("stages:\n"):])
    return "".join(out)
