"""docs/howto-add-an-optimizer.md, step by step: its code registers the optimizer, its KWARGS entry makes the schema
check the kwargs, its YAML loads as params, and the optimizer the registry then builds trains a model. If the page's
steps stop working (a renamed API, a schema rule), this fails."""

from __future__ import annotations

import math
import re

import pytest
import torch

import docrefs
from conftest import MICRO
from scalelab.config import ParamsError, parse_params
from scalelab.config import optim as optim_config
from scalelab.model import Transformer
from scalelab.optim import build_optimizers, registry
from scalelab.optbench import sweep as optbench
from scalelab.runtime import yamlio

PAGE = docrefs.ROOT / "docs" / "howto-add-an-optimizer.md"
VOCAB = 64


def _blocks(lang: str) -> list[str]:
    return [m["body"] for m in docrefs.FENCE.finditer(PAGE.read_text()) if m["lang"].strip() == lang]


@pytest.fixture
def registered(monkeypatch):
    """Step 1 and 2 of the page: its Python block run as families.py would run it, its KWARGS entry added."""
    (code,) = _blocks("python")
    name = re.search(r'register\("(\w+)"', code)[1]
    monkeypatch.setattr(registry, "OPTIMIZERS", dict(registry.OPTIMIZERS))  # the registry, restored afterwards
    namespace: dict = {}
    exec(compile(code, str(PAGE), "exec"), namespace)
    entry = re.search(rf'`"{name}": (\{{[^`]*\}}),`', PAGE.read_text())  # the KWARG_TYPES line the page shows
    assert entry, f"the page shows no KWARG_TYPES entry for {name}"
    types = eval(entry[1], {"float": float, "int": int, "bool": bool, "str": str})  # noqa: S307 (the page's own)
    monkeypatch.setitem(optim_config.KWARG_TYPES, name, types)
    monkeypatch.setitem(optim_config.KWARGS, name, frozenset(types))  # derived from KWARG_TYPES at import
    return name, namespace


def _params(extra: dict | None = None):
    """Step 3: the page's YAML as a part of params.yaml (its keys replace the sections' own, as the docs check reads
    every snippet)."""
    (snippet,) = _blocks("yaml")
    raw = yamlio.safe_load((docrefs.ROOT / "params.yaml").read_text())
    for section, value in {**yamlio.safe_load(snippet), **(extra or {})}.items():
        raw[section] = {**raw.get(section, {}), **value}
    return parse_params(raw, "the how-to's params")


def test_the_documented_optimizer_registers_loads_and_trains(registered):
    name, namespace = registered
    assert registry.spec(name).family == "sign-based"
    params = _params()
    assert name in params.optimizers.optimizers
    assert params.optimizers.planned_runs(name) <= params.optimizers.max_runs
    torch.manual_seed(0)
    model = Transformer(params.resolve_model("xxs", params.optimizers.variant, vocab_size=VOCAB))
    opts = build_optimizers(model, params.optim[name], model.cfg.scale)
    assert isinstance(opts[0], namespace["SignDescent"])
    assert {g["name"] for g in opts[0].param_groups} >= {"matrix", "embedding"}  # element-wise: not matrices_only
    assert all(isinstance(o, torch.optim.AdamW) for o in opts[1:])  # the scale vectors' AdamW
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (8, 17), generator=g)
    losses = [optbench.train_step(model, opts, x[:, :-1], x[:, 1:], seed=step) for step in range(15)]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.1, losses


def test_the_documented_kwargs_entry_makes_a_misspelt_key_fail_first(registered):
    name, _ = registered
    with pytest.raises(ParamsError, match=rf"optim.{name}.*unknown key 'momentun'"):
        _params({"optim": {name: {"name": name, "lr": 3e-4, "kwargs": {"momentun": 0.9}}}})


def test_the_documented_optimizer_keeps_its_state_through_a_resume(registered, tmp_path):
    """The suite's round trip for every registered optimizer (tests/test_optimizers.py), on the page's: saved after 3
    steps and loaded into a fresh one, 3 more steps equal 6 straight, with state for each parameter. The page's
    earlier example kept no state and failed it once a user registered it."""
    import test_optimizers as suite  # as a module: its tests are not collected here a second time

    name, _ = registered
    (snippet,) = _blocks("yaml")
    raw = yamlio.safe_load(MICRO.read_text())
    raw["optim"] = {**raw["optim"], name: yamlio.safe_load(snippet)["optim"][name]}  # as step 2 says for the suite
    suite.test_state_dict_round_trip_continues_identically(parse_params(raw, "micro + the page"), name, tmp_path)


def test_without_the_documented_steps_the_params_are_refused_by_name():
    if "sign_descent" in registry.OPTIMIZERS:  # a checkout where the page was followed: nothing to refuse
        pytest.skip("sign_descent is registered in this checkout (the page's steps are done)")
    with pytest.raises(ParamsError, match="optim.sign_descent.name: unknown optimizer 'sign_descent'"):
        _params()
    with pytest.raises(ValueError, match="unknown optimizer 'sign_descent'"):
        registry.spec("sign_descent")


def test_the_page_says_its_snippet_is_checked_here():
    """The docs check leaves the page's YAML to this file (its first line says so): this file must load it."""
    (snippet,) = _blocks("yaml")
    assert snippet.splitlines()[0].startswith("# checked by tests/test_howto_optimizer.py")
