"""docs/howto-compress-your-model.md, its snippets as written: the laptop variant's params and machine line pass
`scalelab check`'s checks offline; the GPU variant's hub split is refused offline until it is cached, and its
machine line on a machine without CUDA, with the CPU line named; the model the page loads and evaluates is a cell of
the laptop grid, under a name DVC can address. Running the compression itself is the default DAG's (the laptop
variant is its compression at one seed): tests/test_compress.py runs the stage on the micro profile."""

from __future__ import annotations

import re

import pytest

import docrefs
from scalelab.config import ParamsError, machine, parse_params
from scalelab.pipeline import runnable
from scalelab.runtime import yamlio

PAGE = docrefs.ROOT / "docs" / "howto-compress-your-model.md"


def _yaml_blocks() -> list[dict]:
    return [yamlio.safe_load(m["body"]) for m in docrefs.FENCE.finditer(PAGE.read_text())
            if m["lang"].strip() in ("yaml", "yml")]


def _variants() -> tuple[dict, dict]:
    """(laptop, GPU): the page's `compress:` blocks, in its order (the laptop first)."""
    blocks = [b["compress"] for b in _yaml_blocks() if "source" in (b.get("compress") or {})]
    assert len(blocks) == 2 and "hub" not in blocks[0]["eval"] and "hub" in blocks[1]["eval"], blocks
    return blocks[0], blocks[1]


def _params(compress: dict, *extra: dict):
    """params.yaml with the page's snippets set into its sections (their keys replace the sections' own)."""
    raw = yamlio.safe_load((docrefs.ROOT / "params.yaml").read_text())
    for snippet in ({"compress": compress}, *extra):
        for section, value in snippet.items():
            raw[section] = {**(raw.get(section) or {}), **value}
    return parse_params(raw, "params.yaml + the how-to's snippets")


def test_the_laptop_variant_passes_the_check_offline():
    laptop, _ = _variants()
    (evaluate,) = [b for b in _yaml_blocks() if "evaluate" in b]
    params = _params(laptop, evaluate)
    runnable.check_keys(params, docrefs.ROOT / "dvc.yaml")  # the evaluated model's name too
    runnable.check_hub_offline(params)  # nothing from the hub: the prepared corpus's validation split
    assert runnable.offline() and params.compress.eval.hub is None
    (machine_block,) = [b for b in _yaml_blocks() if set(b) == {"compress"} and "device" in b["compress"]]
    local = machine.validate(machine_block, "the page's machine.yaml")
    raw = yamlio.safe_load((docrefs.ROOT / "params.yaml").read_text())
    raw["compress"] |= laptop
    params = parse_params(raw, "with the page's machine.yaml", local)  # as machine.yaml: over the machine: section
    assert params.compress.device == machine_block["compress"]["device"]
    runnable.check_cuda(params, docrefs.ROOT / "machine.yaml", available=lambda: False)  # CPU: passes without CUDA


def test_the_gpu_variant_is_refused_offline_until_its_split_is_cached():
    _, gpu = _variants()
    params = _params(gpu)
    split = params.compress.eval.hub
    if runnable._read_error(split) is None:
        pytest.skip(f"{split.hub_id} is in this machine's datasets cache")
    with pytest.raises(ParamsError, match=r"compress\.eval\.hub: Salesforce/wikitext/wikitext-2-raw-v1:test cannot be "
                                          r"read offline"):
        runnable.check_hub_offline(params)


def test_the_gpu_machine_line_is_refused_without_cuda_naming_the_cpu_line():
    text = " ".join(PAGE.read_text().split())
    line = re.search(r"On a GPU, `(compress: \{[^`]*\})`", text)
    assert line, "the page names no GPU machine line"
    raw = yamlio.safe_load((docrefs.ROOT / "params.yaml").read_text())
    params = parse_params(raw, "the page", machine.validate(yamlio.safe_load(line[1]), "the page"))
    assert params.compress.device == "cuda"
    with pytest.raises(ParamsError, match=r"compress\.device: cuda, but this machine has no CUDA device: .* put "
                                          r"`compress: \{device: cpu\}`"):
        runnable.check_cuda(params, docrefs.ROOT / "machine.yaml", available=lambda: False)


def test_the_model_it_loads_and_evaluates_is_a_cell_of_the_laptop_grid():
    laptop, _ = _variants()
    params = _params(laptop)
    assert params.compress.save_models
    g = params.compress.grid
    saved = {f"data/compress/seed-{s}/{params.compress.cell(m, str(k), s)}/model"
             for m in g.methods for k in g.keep for s in g.seeds}
    loaded = re.findall(r'from_pretrained\("([^"]+)"\)', PAGE.read_text())
    (evaluate,) = [b["evaluate"] for b in _yaml_blocks() if "evaluate" in b]
    evaluated = [m["path"] for m in evaluate["models"].values()]
    assert loaded and evaluated and set(loaded + evaluated) <= saved, (loaded, evaluated, sorted(saved))
    assert not any("." in name for name in evaluate["models"])
