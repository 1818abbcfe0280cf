"""Parameter groups follow the scale-vector weight-decay policy (METHODS §A); schedules have the right shape."""

import math

import pytest
import torch
from torch import nn

from scalelab.config import OptimizerConfig, ScaleConfig, ScheduleConfig
from scalelab.optim import apply_lr, build_optimizers, lr_factor


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
