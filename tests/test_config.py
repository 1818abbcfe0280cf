"""The params schema: every shipped params file validates; typos and bad values fail naming the key path."""

import re
from pathlib import Path

import pytest
import yaml
from mutants import assert_caught, mutant

from scalelab.config import ParamsError, load_params, parse_params

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
    return yaml.safe_load((ROOT / "params.yaml").read_text())


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
    good = ROOT / "configs" / "cpu-study.yaml"
    assert profile.main([str(good)]) == 0
    assert Path("params.yaml").read_bytes() == good.read_bytes()
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


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_param_that_dvc_tracks_is_spelled_out(path, tmp_path):
    """DVC reads params.yaml itself, without the schema's defaults: each key a stage depends on must be present."""
    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    (tmp_path / ".dvc").mkdir()
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    (tmp_path / "params.yaml").write_text(path.read_text())
    raw = yaml.safe_load(path.read_text())
    missing = []
    with Repo(str(tmp_path), uninitialized=True) as repo:
        for stage in repo.index.stages:
            for dep in stage.deps:
                if isinstance(dep, ParamsDependency):
                    for key in dep.params:
                        node = raw
                        for part in key.split("."):
                            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
                        if node is KeyError:
                            missing.append(f"{stage.addressing}: {key}")
    assert not missing, missing
