"""Parameter groups follow the scale-vector weight-decay policy (docs/scale-vectors.md); schedules have the right
shape."""

import math

import pytest
import torch
from mutants import mutant, mutation_checks
from torch import nn

from scalelab.config import OptimizerConfig, ScaleConfig, ScheduleConfig
from scalelab.optim import apply_lr, build_optimizers, lr_factor
from scalelab.runtime import yamlio


class Toy(nn.Module):
    """One parameter of every kind, named like the model's."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Parameter(torch.randn(10, 4))
        self.w = nn.Parameter(torch.randn(4, 4))
        self.g_in = nn.Parameter(torch.ones(4))
        self.g_out = nn.Parameter(torch.ones(4))

    def param_kind(self, name):
        return {"wte": "embedding", "w": "matrix", "g_in": "input_scale", "g_out": "output_scale"}[name]


def _groups(opts):
    return {g["name"]: (type(o).__name__, g) for o in opts for g in o.param_groups}


@pytest.mark.parametrize("wd_in,wd_out", [(False, False), (True, False), (False, True), (True, True)])
def test_scale_decay_follows_policy(wd_in, wd_out):
    cfg = OptimizerConfig(name="adamw", lr=1e-3, weight_decay=0.1)
    groups = _groups(build_optimizers(Toy(), cfg, ScaleConfig(wd_input_scales=wd_in, wd_output_scales=wd_out)))
    assert groups["matrix"][1]["weight_decay"] == 0.1
    assert groups["input_scale"][1]["weight_decay"] == (0.1 if wd_in else 0.0)
    assert groups["output_scale"][1]["weight_decay"] == (0.1 if wd_out else 0.0)


def test_muon_takes_matrices_only_and_scales_go_to_adamw():
    cfg = OptimizerConfig(name="muon", lr=2e-3, adamw_lr=1e-3, weight_decay=0.1)
    model = Toy()
    opts = build_optimizers(model, cfg, ScaleConfig(wd_input_scales=True))
    groups = _groups(opts)
    assert groups["matrix"][0] == "Muon" and groups["matrix"][1]["params"] == [model.w]
    for kind in ("embedding", "input_scale", "output_scale"):
        assert groups[kind][0] == "AdamW", kind
        assert groups[kind][1]["base_lr"] == 1e-3
    assert groups["input_scale"][1]["weight_decay"] == 0.1 and groups["output_scale"][1]["weight_decay"] == 0.0
    # every parameter is in exactly one group
    seen = [id(p) for o in opts for g in o.param_groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in model.parameters())


def test_unknown_optimizer_is_named():
    with pytest.raises(ValueError, match="unknown optimizer 'adamv'"):
        build_optimizers(Toy(), OptimizerConfig(name="adamv"), ScaleConfig())


def test_schedules():
    total = 100
    cos = ScheduleConfig(name="cosine", warmup=0.1, min_lr_ratio=0.1)
    f = [lr_factor(cos, s, total) for s in range(total)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warmup over 10 steps
    assert all(a >= b for a, b in zip(f[10:], f[11:]))  # monotone decay after warmup
    assert f[-1] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 89 / 90)))
    wsd = ScheduleConfig(name="wsd", warmup=0.1, decay=0.2, min_lr_ratio=0.0)
    g = [lr_factor(wsd, s, total) for s in range(total)]
    assert all(x == 1.0 for x in g[10:80])  # stable phase
    assert g[80] == 1.0 and g[90] == pytest.approx(0.5) and g[-1] == pytest.approx(0.05)
    const = ScheduleConfig(name="constant", warmup=0.0)
    assert {lr_factor(const, s, total) for s in range(total)} == {1.0}


def test_apply_lr_scales_each_group_base_lr():
    opts = build_optimizers(Toy(), OptimizerConfig(name="muon", lr=2e-3, adamw_lr=1e-3), ScaleConfig())
    apply_lr(opts, 0.5)
    lrs = {g["name"]: g["lr"] for o in opts for g in o.param_groups}
    assert lrs["matrix"] == pytest.approx(1e-3) and lrs["embedding"] == pytest.approx(5e-4)


def test_scales_get_adamw_under_any_optimizer():
    model = Toy()
    groups = _groups(build_optimizers(model, OptimizerConfig(name="sgd", lr=0.1, adamw_lr=1e-3), ScaleConfig()))
    assert groups["matrix"][0] == groups["embedding"][0] == "SGD"
    assert groups["input_scale"][0] == groups["output_scale"][0] == "AdamW"
    assert groups["input_scale"][1]["base_lr"] == 1e-3


def test_magdir_decays_the_magnitude_not_the_direction(micro_params):
    from scalelab.model import Transformer

    params = micro_params
    model = Transformer(params.resolve_model("a", "unified", vocab_size=64))
    groups = _groups(build_optimizers(model, params.optim["adamw"], model.cfg.scale))
    names = {id(p): n for n, p in model.named_parameters()}
    assert groups["input_scale"][1]["weight_decay"] == 0.1  # unified: decay on input scales (their g)
    assert all(names[id(p)].endswith(".g") for p in groups["input_scale"][1]["params"])
    assert groups["input_scale_direction"][1]["weight_decay"] == 0.0
    assert all(names[id(p)].endswith(".v") for p in groups["input_scale_direction"][1]["params"])
    assert groups["output_scale_direction"][1]["weight_decay"] == 0.0


def test_unknown_optimizer_kwargs_are_rejected_by_the_params_schema_naming_the_key(tmp_path):
    """A misspelt library argument (pytorch-optimizer's classes swallow unknown **kwargs) fails the params check with
    its path and key, before any compute; known keys pass."""
    import yaml
    from conftest import MICRO

    from scalelab.config import ParamsError, load_params

    raw = yamlio.safe_load(MICRO.read_text())
    raw["optim"]["ademamix"]["kwargs"]["alpah"] = 1
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError, match="optim.ademamix.*unknown key 'alpah' for optimizer 'ademamix'"):
        load_params(tmp_path / "p.yaml")
    assert OptimizerConfig(name="ademamix", kwargs={"alpha": 4.0, "t_alpha_beta3": 10}).kwargs["alpha"] == 4.0


def test_the_kwargs_table_matches_the_libraries():
    """Every key the schema accepts is an argument of the family's library class (or one its factory takes itself),
    so the table cannot drift into accepting what the library would ignore."""
    import inspect

    import pytorch_optimizer as po

    from scalelab.config.optim import FACTORY_KWARGS, KWARGS
    from scalelab.optim import OPTIMIZERS

    classes = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "adafactor": torch.optim.Adafactor,
               "muon": torch.optim.Muon, "lion": po.Lion, "signum": po.SignSGD, "soap": po.SOAP,
               "sophia": po.SophiaH, "adam_mini": po.AdamMini, "galore": po.GaLore, "ademamix": po.AdEMAMix,
               "mars": po.MARS, "sf_adamw": po.ScheduleFreeAdamW}
    assert set(classes) == set(OPTIMIZERS) == set(KWARGS)
    for name, cls in classes.items():
        known = set(inspect.signature(cls.__init__).parameters) | FACTORY_KWARGS.get(name, set())
        assert KWARGS[name] <= known, (name, sorted(KWARGS[name] - known))


@pytest.mark.parametrize("mult", [0.0, 10.0])
def test_scale_decay_dose_multiplies_the_matrices_rate(mult):
    cfg = OptimizerConfig(name="muon", lr=1e-3, weight_decay=0.1, scale_wd_mult=mult)
    groups = _groups(build_optimizers(Toy(), cfg, ScaleConfig(wd_input_scales=True, wd_output_scales=True)))
    assert groups["matrix"][1]["weight_decay"] == 0.1  # the matrices keep theirs
    assert groups["input_scale"][1]["weight_decay"] == pytest.approx(0.1 * mult)
    assert groups["output_scale"][1]["weight_decay"] == pytest.approx(0.1 * mult)


def test_schedule_free_takes_the_scale_vectors_into_its_averaged_optimizer():
    """No side AdamW under Schedule-Free: its constant schedule would leave the γ groups un-decayed in LR and never
    averaged. Every parameter in the one Schedule-Free optimizer, scale decay by the variant's policy."""
    model = Toy()
    cfg = OptimizerConfig(name="sf_adamw", lr=2.5e-3, weight_decay=0.1)
    opts = build_optimizers(model, cfg, ScaleConfig(wd_input_scales=True))
    assert len(opts) == 1 and type(opts[0]).__name__ == "ScheduleFreeAdamW"
    groups = _groups(opts)
    assert groups["input_scale"][1]["weight_decay"] == 0.1 and groups["output_scale"][1]["weight_decay"] == 0.0
    assert sorted(id(p) for g in opts[0].param_groups for p in g["params"]) == sorted(map(id, model.parameters()))


def test_a_gamma_decay_dose_moves_gamma(micro_params):
    """A weight-decay dose on γ: 10 AdamW steps on the same batches and init, decay on input-norm γ at 0x and 100x the
    matrices' rate: the 100x arm's mean input γ ends lower (dose λ·η·T = 0.1·100·1e-2·10 = 1), the output-norm γ
    (undecayed in both arms) and the matrices' rate as they were."""
    from scalelab.model import Transformer

    means = {}
    for mult in (0.0, 100.0):
        torch.manual_seed(0)
        model = Transformer(micro_params.resolve_model("a", "standard", vocab_size=64))
        scale = model.cfg.scale.model_copy(update={"wd_input_scales": True})
        cfg = OptimizerConfig(name="adamw", lr=1e-2, weight_decay=0.1, scale_wd_mult=mult)
        opts = build_optimizers(model, cfg, scale)
        g = torch.Generator().manual_seed(0)
        for _ in range(10):
            x = torch.randint(0, 64, (4, 17), generator=g)
            model(x[:, :-1], x[:, 1:]).loss.backward()
            for o in opts:
                o.step()
                o.zero_grad()
        kinds = {}
        for n, p in model.named_parameters():
            kinds.setdefault(model.param_kind(n), []).append(p.detach().flatten())
        means[mult] = {k: torch.cat(v).mean().item() for k, v in kinds.items() if k.endswith("scale")}
    assert means[100.0]["input_scale"] < means[0.0]["input_scale"] - 0.2, means
    assert means[100.0]["output_scale"] == pytest.approx(means[0.0]["output_scale"], abs=0.05), means


# Mutation checks (tests/mutants.py)
@mutant("kwargs-unchecked")  # the schema passes any optim kwargs key on
def _(monkeypatch):
    from scalelab.config import optim

    monkeypatch.setattr(optim, "KWARGS", {})


@mutant("scale-dose-ignored")  # decay on γ at the matrices' rate whatever scale_wd_mult says
def _(monkeypatch):
    from scalelab.optim import registry

    real = registry.param_groups
    monkeypatch.setattr(registry, "param_groups", lambda model, cfg, scale: real(
        model, cfg.model_copy(update={"scale_wd_mult": 1.0}), scale))


@mutant("schedule-free-side-adamw")  # the γ groups back on a side AdamW under Schedule-Free
def _(monkeypatch):
    from scalelab.optim import OPTIMIZERS

    monkeypatch.setitem(OPTIMIZERS, "sf_adamw", OPTIMIZERS["sf_adamw"].__class__(
        OPTIMIZERS["sf_adamw"].factory, family="schedule-free", library="pytorch-optimizer", schedule_free=False))


T = "tests/test_optim.py::"
test_a_broken_rule_is_caught = mutation_checks([
    ("kwargs-unchecked", f"{T}test_unknown_optimizer_kwargs_are_rejected_by_the_params_schema_naming_the_key"),
    ("scale-dose-ignored", f"{T}test_scale_decay_dose_multiplies_the_matrices_rate"),
    ("scale-dose-ignored", f"{T}test_a_gamma_decay_dose_moves_gamma"),
    ("schedule-free-side-adamw", f"{T}test_schedule_free_takes_the_scale_vectors_into_its_averaged_optimizer"),
])
