"""The params schema: every shipped params file validates; typos and bad values fail naming the key path."""

import re
from pathlib import Path

import pytest
import yaml
from mutants import assert_caught, mutant, mutation_checks

from scalelab.config import ParamsError, load_params, parse_params
from scalelab.config.params import read_yaml
from scalelab.runtime import yamlio

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [ROOT / "params.yaml", *sorted((ROOT / "configs").glob("*.yaml")), ROOT / "tests" / "micro_params.yaml"]


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_params_file_validates(path):
    params = load_params(path)
    grid = params.pretrain.grid
    # every cell of the matrices resolves to a valid model
    for variant in grid.variants:
        for size in grid.sizes:
            params.resolve_model(size, variant, vocab_size=params.tokenizer.vocab_size)
    for recipe in grid.recipes:
        for variant in grid.recipe_variants:
            for size in grid.recipe_sizes:
                params.resolve_model(size, variant, vocab_size=params.tokenizer.vocab_size, recipe=recipe)


def _raw():
    return yamlio.safe_load((ROOT / "params.yaml").read_text())


def test_unknown_key_is_named():
    raw = _raw()
    raw["prepare"]["val_fractoin"] = 0.1
    with pytest.raises(ParamsError, match=r"prepare\.val_fractoin: unknown key"):
        parse_params(raw)


def test_nested_unknown_key_is_named():
    raw = _raw()
    raw["model"]["sizes"]["xs"]["n_layers"] = 3
    with pytest.raises(ParamsError, match=r"model\.sizes\.xs\.n_layers"):
        parse_params(raw)


@pytest.mark.parametrize(
    "section,key,value,needle",
    [
        ("prepare", "val_fraction", 0.7, "prepare.val_fraction"),
        ("tokenizer", "vocab_size", 10, "tokenizer.vocab_size"),
        ("pretrain", "precision", "fp8", "pretrain.precision"),
        ("pretrain", "batch_size", 0, "pretrain.batch_size"),
    ],
)
def test_bad_values_are_named(section, key, value, needle):
    raw = _raw()
    raw[section][key] = value
    with pytest.raises(ParamsError, match=needle.replace(".", r"\.")):
        parse_params(raw)


def test_cross_references_are_checked():
    raw = _raw()
    raw["pretrain"]["grid"]["variants"].append("unifed")
    with pytest.raises(ParamsError, match="unknown variant 'unifed'"):
        parse_params(raw)
    raw = _raw()
    raw["pretrain"]["recipes"]["base"]["optimizer"] = "adamv"
    with pytest.raises(ParamsError, match=r"pretrain\.recipes\.base\.optimizer"):
        parse_params(raw)


def test_model_shape_checks():
    """At load time, under the size's key path (a traceback from resolve_model before)."""
    for key, value, needle in (("n_kv_head", 3, "n_head (4) must be divisible by n_kv_head (3)"),
                               ("n_head", 3, "d_model (64) must be divisible by n_head (3)"),
                               ("d_model", 60, "head_dim = d_model / n_head (15) must be even"),
                               ("d_ff", float("inf"), "d_ff")):
        raw = _raw()
        raw["model"]["sizes"]["xs"][key] = value
        with pytest.raises(ParamsError, match=rf"model\.sizes\.xs.*{re.escape(needle)}"):
            parse_params(raw)


def test_floats_are_finite_and_names_safe():
    for section, key, value in (("optim", "adamw", {"name": "adamw", "lr": float("inf")}),
                                ("optim", "adamw", {"name": "adamw", "lr": float("nan")}),
                                ("pretrain", "grad_clip", float("inf"))):
        raw = _raw()
        raw[section][key] = value
        with pytest.raises(ParamsError, match=rf"{section}\.{key}"):
            parse_params(raw)
    raw = _raw()
    raw["optim"]["adam w"] = raw["optim"]["adamw"]
    with pytest.raises(ParamsError, match=r"optim\.adam w: invalid name"):
        parse_params(raw)


def test_missing_file_is_clear(tmp_path):
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "nope.yaml")


@pytest.mark.parametrize("bad", ["unknown-key", "yaml-syntax", "missing"])
def test_an_invalid_profile_switch_leaves_params_yaml_and_its_prev_untouched(tmp_path, monkeypatch, capsys, bad):
    """`python -m scalelab.pipeline.profile bad.yaml` refuses with a one-line error naming the problem, and params.yaml and
    params.yaml.prev keep their bytes (nothing lost); a valid profile then switches, keeping the old one as .prev."""
    from scalelab.pipeline import profile

    monkeypatch.chdir(tmp_path)
    current, prev = ROOT / "tests" / "micro_params.yaml", b"# the profile before the current one\n"
    Path("params.yaml").write_bytes(current.read_bytes())
    Path("params.yaml.prev").write_bytes(prev)
    profile_file = Path("bad.yaml")
    if bad == "unknown-key":
        profile_file.write_text(current.read_text().replace("seed: 0", "seed: 0\nseeed: 1", 1))
    elif bad == "yaml-syntax":
        profile_file.write_text(current.read_text() + "\npretrain: [unclosed\n")
    assert profile.main([str(profile_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.yaml" in err, err
    assert re.search({"unknown-key": "seeed", "yaml-syntax": "YAML syntax", "missing": "not found"}[bad], err), err
    assert Path("params.yaml").read_bytes() == current.read_bytes()
    assert Path("params.yaml.prev").read_bytes() == prev
    good = ROOT / "configs" / "cpu-study.yaml"  # an overlay: written composed, complete
    assert profile.main([str(good)]) == 0
    assert yamlio.safe_load(Path("params.yaml").read_text()) == read_yaml(good) and "base" not in read_yaml(good)
    assert load_params("params.yaml") == load_params(good)
    assert Path("params.yaml.prev").read_bytes() == current.read_bytes()


@mutant("profile-writes-first")
def _(monkeypatch):  # copy the profile over params.yaml, then validate it
    import shutil

    from scalelab.pipeline import profile

    def switch(prof, target=Path("params.yaml")):
        if target.exists():
            shutil.copy2(target, target.with_suffix(".yaml.prev"))
        shutil.copyfile(prof, target)
        load_params(target)
    monkeypatch.setattr(profile, "switch", switch)


@pytest.mark.mutation
def test_the_profile_switch_test_catches_writing_before_validating():
    assert_caught("tests/test_config.py::test_an_invalid_profile_switch_leaves_params_yaml_and_its_prev_untouched"
                  "[unknown-key]", "profile-writes-first")


def test_bad_regex_is_a_params_error():
    raw = _raw()
    raw["prepare"]["corpus"]["doc_split_regex"] = "^(SCENE"
    with pytest.raises(ParamsError, match=r"prepare\.corpus.*not a valid regex"):
        parse_params(raw)


# Machine settings (scalelab.config.machine): not params, merged in from layers DVC does not track.
MACHINE_OLD = {"pretrain": {"threads": 3, "devices": 2, "strategy": "ddp", "compile": True, "peak_flops": 1e12},
               "evaluate": {"device": "cpu", "threads": 3}, "compress": {"device": "auto", "threads": 3},
               "hidden_decoding": {"train": {"threads": 3, "peak_flops": 1e12}}}


def _micro_in(tmp_path) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text((ROOT / "tests" / "micro_params.yaml").read_text())
    return path


def test_machine_file_beside_params_wins_over_the_profiles_machine_section(tmp_path, monkeypatch):
    monkeypatch.delenv("SCALELAB_MACHINE", raising=False)
    path = _micro_in(tmp_path)
    before = load_params(path)
    assert before.pretrain.threads == 1 and before.evaluate.device == "cpu"  # the micro profile's machine: section
    (tmp_path / "machine.yaml").write_text(yaml.safe_dump(MACHINE_OLD))
    after = load_params(path)
    assert (after.pretrain.threads, after.pretrain.devices, after.pretrain.strategy, after.pretrain.compile,
            after.pretrain.peak_flops) == (3, 2, "ddp", True, 1e12)
    assert (after.evaluate.threads, after.compress.device, after.compress.threads) == (3, "auto", 3)
    assert (after.hidden_decoding.train.threads, after.hidden_decoding.train.peak_flops) == (3, 1e12)
    # what is not a machine setting is untouched
    assert after.model_dump(exclude={"pretrain", "evaluate", "compress", "hidden_decoding"}) == \
        before.model_dump(exclude={"pretrain", "evaluate", "compress", "hidden_decoding"})
    assert after.pretrain.model_dump(exclude=set(MACHINE_OLD["pretrain"])) == \
        before.pretrain.model_dump(exclude=set(MACHINE_OLD["pretrain"]))
    other = tmp_path / "elsewhere.yaml"  # $SCALELAB_MACHINE instead of the file beside params
    other.write_text("pretrain: {threads: 5}\n")
    monkeypatch.setenv("SCALELAB_MACHINE", str(other))
    assert load_params(path).pretrain.threads == 5
    monkeypatch.setenv("SCALELAB_MACHINE", str(tmp_path / "missing.yaml"))
    with pytest.raises(ParamsError, match="SCALELAB_MACHINE=.*missing.yaml: no such machine file"):
        load_params(path)


@pytest.mark.parametrize("key", ["pretrain.threads", "pretrain.compile", "evaluate.device", "compress.threads",
                                 "hidden_decoding.train.accelerator"])
def test_a_machine_setting_inline_in_params_yaml_is_refused_naming_where_it_goes(tmp_path, monkeypatch, key):
    monkeypatch.delenv("SCALELAB_MACHINE", raising=False)
    path = _micro_in(tmp_path)
    raw = yamlio.safe_load(path.read_text())
    *section, name = key.split(".")
    node = raw
    for part in section:
        node = node[part]
    node[name] = "cuda" if name == "device" else "gpu" if name == "accelerator" else 2
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError) as err:
        load_params(path)
    msg = str(err.value)
    assert "\n" not in msg and key in msg and "machine.yaml" in msg and "`machine:` section" in msg, msg
    # the same keys in a params file DVC does not read (a file built for one library run) are its defaults
    other = tmp_path / "run.yaml"
    other.write_text(path.read_text())
    assert load_params(other) is not None


@pytest.mark.parametrize("bad,needle", [({"pretrain": {"batch_size": 4}}, r"pretrain\.batch_size: not a machine"),
                                        ({"optim": {"adamw": {}}}, r"optim: not a section with machine settings"),
                                        ({"hidden_decoding": {"seeds": [1]}}, r"hidden_decoding\.seeds: not a sec"),
                                        ({"pretrain": {"threads": -1}}, r"machine\.yaml.*pretrain\.threads")])
def test_a_bad_machine_file_is_one_line_naming_the_key(tmp_path, monkeypatch, bad, needle):
    """Science cannot hide in the machine file (batch_size there would change results without DVC knowing), and a
    bad value names the file it came from."""
    monkeypatch.delenv("SCALELAB_MACHINE", raising=False)
    path = _micro_in(tmp_path)
    (tmp_path / "machine.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ParamsError, match=needle) as err:
        load_params(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_param_that_dvc_tracks_is_spelled_out_and_none_is_a_machine_setting(path, tmp_path):
    """DVC's own view of the real dvc.yaml. DVC reads params.yaml itself, without the schema's defaults: each key a
    stage depends on must be present. And no stage's params name a machine setting, the `machine` section, or a
    section holding one, and no stage depends on the machine file, so changing them leaves `dvc status` clean
    (tests/test_anyshell.py runs it); params.yaml is a file dependency of `validate` alone (a machine: section edit
    reruns that check only)."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    from scalelab.config.machine import MACHINE_FILE, MACHINE_KEYS, SECTION

    machine_paths = [f"{s}.{k}" for s, keys in MACHINE_KEYS.items() for k in keys]
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    from scalelab.config import profiles

    (tmp_path / "params.yaml").write_text(profiles.complete_text(path))  # as `scalelab profile` writes it
    raw = yamlio.safe_load((tmp_path / "params.yaml").read_text())
    missing, machine, file_deps = [], [], {}
    with Repo(str(tmp_path), uninitialized=True) as repo:
        for stage in repo.index.stages:
            for dep in stage.deps:
                if not isinstance(dep, ParamsDependency):
                    file_deps.setdefault(Path(dep.fs_path).name, set()).add(stage.name.split("@")[0])
                    continue
                for key in dep.params:
                    if _lookup(raw, key) is None:
                        missing.append(f"{stage.addressing}: {key}")
                    # what DVC hashes for `key`: its value in params.yaml, with every machine key under it
                    inside = [p for p in machine_paths if p == key or p.startswith(f"{key}.")]
                    if key.split(".")[0] == SECTION or any(_lookup(raw, p) is not None for p in inside):
                        machine.append(f"{stage.addressing}: {key}")
    assert not missing, missing
    assert not machine, machine
    assert MACHINE_FILE not in file_deps
    assert file_deps["params.yaml"] == {"validate"}


def _lookup(raw: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(raw, dict) or part not in raw:
            return None
        raw = raw[part]
    return raw if raw is not None else "null"


# ---------------------------------------------------------------- library kwargs: names and types
def _library_classes():
    import pytorch_optimizer as po
    import torch

    return {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "adafactor": torch.optim.Adafactor,
            "muon": torch.optim.Muon, "lion": po.Lion, "signum": po.SignSGD, "soap": po.SOAP, "sophia": po.SophiaH,
            "adam_mini": po.AdamMini, "galore": po.GaLore, "ademamix": po.AdEMAMix, "mars": po.MARS,
            "sf_adamw": po.ScheduleFreeAdamW}


def test_the_kwarg_types_are_the_libraries_signatures():
    """Each kwarg's type in the schema is its library's annotation (the default's type where there is none), or for
    a key the factory takes itself, that of the projector it configures; and each library default is a valid value."""
    import inspect
    from typing import Annotated, get_args, get_origin, get_type_hints

    from pytorch_optimizer.optimizer.utils.galore import GaLoreProjector

    from scalelab.config.optim import FACTORY_KWARGS, KWARG_TYPES, check_kwargs

    def bare(t):
        return get_args(t)[0] if get_origin(t) is Annotated else t

    factory_types = {**get_type_hints(GaLoreProjector.__init__), "rank_ratio": float, "beta3": float}
    classes = _library_classes()
    assert set(KWARG_TYPES) == set(classes)
    for name, cls in classes.items():
        hints, params = get_type_hints(cls.__init__), inspect.signature(cls.__init__).parameters
        for key, typ in KWARG_TYPES[name].items():
            if key in FACTORY_KWARGS.get(name, ()):
                assert bare(typ) == factory_types[key], (name, key)
                continue
            default = params[key].default
            assert bare(typ) == hints.get(key, type(default)), (name, key, typ, hints.get(key))
            if default is not inspect.Parameter.empty:
                check_kwargs(name, {key: list(default) if isinstance(default, tuple) else default})


@pytest.mark.parametrize("name,key,value,needle", [
    ("galore", "rank_ratio", "not-a-number", "Input should be a valid number"),
    ("galore", "rank_ratio", 0, "greater than 0"),
    ("galore", "projection_type", "sdt", "Input should be 'std'"),
    ("adamw", "foreach", 1, "Input should be a valid boolean"),
    ("muon", "ns_steps", 5.0, "Input should be a valid integer"),
    ("mars", "betas_1d", [0.9], r"tuple\[float, float\]"),
    ("sophia", "p", "1e-3", "YAML reads 1e-3 as a string"),
    ("ademamix", "t_alpha_beta3", float("inf"), "finite"),
])
def test_a_kwarg_of_the_wrong_type_is_named(name, key, value, needle):
    raw = _raw()
    raw["optim"][name].setdefault("kwargs", {})[key] = value
    with pytest.raises(ParamsError, match=rf"optim\.{name}\.kwargs: {key}: .*{needle}"):
        parse_params(raw)


def test_kwargs_reach_the_library_as_its_types():
    """A YAML list becomes the tuple the signature names, an int the float; the optimizer builds with them."""
    from torch import nn

    from scalelab.config import OptimizerConfig

    cfg = OptimizerConfig(name="muon", kwargs={"ns_coefficients": [3, -4.775, 2.0315], "eps": 1})
    assert cfg.kwargs == {"ns_coefficients": (3.0, -4.775, 2.0315), "eps": 1.0}
    assert type(cfg.kwargs["eps"]) is float
    from scalelab.optim.families import _muon

    opt = _muon([{"params": [nn.Parameter(nn.init.eye_(nn.Linear(4, 4).weight.detach().clone()))]}], cfg, None)
    assert opt.param_groups[0]["ns_coefficients"] == (3.0, -4.775, 2.0315)


def test_an_unregistered_optimizer_is_named():
    raw = _raw()
    raw["optim"]["adamw"]["name"] = "adamww"
    with pytest.raises(ParamsError, match=r"optim\.adamw\.name: unknown optimizer 'adamww'; registered: "):
        parse_params(raw)


@mutant("kwargs-types-unchecked")  # kwargs checked by name only, as before
def _(monkeypatch):
    from scalelab.config import optim

    monkeypatch.setattr(optim, "_adapter", lambda name, key: __import__("pydantic").TypeAdapter(object))


@mutant("machine-file-ignored")
def _(monkeypatch):
    from scalelab.config import machine

    monkeypatch.setattr(machine, "read_machine", lambda path: {})


@mutant("machine-inline-accepted")
def _(monkeypatch):
    from scalelab.config import machine

    monkeypatch.setattr(machine, "refuse_inline", lambda raw, source: None)


test_the_machine_tests_are_caught = mutation_checks([
    ("kwargs-types-unchecked", "tests/test_config.py::test_a_kwarg_of_the_wrong_type_is_named[galore-rank_ratio-not-"
                               "a-number-Input should be a valid number]"),
    ("machine-file-ignored",
     "tests/test_config.py::test_machine_file_beside_params_wins_over_the_profiles_machine_section"),
    ("machine-inline-accepted", "tests/test_config.py::test_a_machine_setting_inline_in_params_yaml_is_refused_naming"
                                "_where_it_goes[pretrain.threads]"),
])
