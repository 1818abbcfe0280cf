"""The pretrain cells' mean γ of each scale kind (train/callbacks.py `kind_means`): input-norm, output-norm (QK-norm)
and the final norm's apart, each what the per-vector statistics say, and each moved by a weight decay on its own
kind only: the measurement the γ weight-decay dose study reads its "γ moved" premise from."""

import csv
import statistics

import pytest
from test_train import make_shards, micro_raw

from scalelab.config import parse_params
from scalelab.train import Cell, fit

DOSE = 100.0  # × the matrices' decay: λ·η 0.1 at peak lr, enough to move γ in 30 steps


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("tokens"))


@pytest.fixture(scope="module")
def runs(shards, tmp_path_factory):
    """standard (no decay on γ), wd_in and wd_out at DOSE, on one seed: the same batches and init."""
    raw = micro_raw(max_steps=30, sharpness={"enabled": False},
                    recipes={"base": {"optimizer": "adamw"}, "dose": {"optimizer": "adamw_dose"}})
    raw["model"]["variants"] |= {"wd_in": {"wd_input_scales": True}, "wd_out": {"wd_output_scales": True}}
    raw["optim"]["adamw_dose"] = {**raw["optim"]["adamw"], "scale_wd_mult": DOSE}
    params, out = parse_params(raw), tmp_path_factory.mktemp("runs")
    return {(v, r): (fit(params, Cell(v, "a", r, 0), out / f"{v}-{r}", shards), out / f"{v}-{r}")
            for v, r in (("standard", "base"), ("wd_in", "dose"), ("wd_out", "dose"))}


def test_each_kind_mean_is_the_mean_of_its_vectors(runs):
    """gamma_input_mean averages the blocks' input-norm γ (pre-attention and pre-MLP), gamma_output_mean the QK-norm
    γ, gamma_final_mean is the final norm's alone: each equals the per-vector means of the last gamma.csv row."""
    for metrics, out in runs.values():
        last = list(csv.DictReader(open(out / "model/gamma.csv")))[-1]
        per_vector = {k.split("/")[1]: float(v) for k, v in last.items() if k.endswith("/mean") and k != "step"}
        blocks = [v for k, v in per_vector.items() if k.endswith(("attn_scale", "mlp_scale"))]
        qk = [v for k, v in per_vector.items() if k.endswith(("q_scale", "k_scale"))]
        assert len(blocks) == 2 and len(qk) == 2 and len(per_vector) == 5
        assert metrics["gamma_input_mean"] == pytest.approx(statistics.fmean(blocks), abs=1e-6)
        assert metrics["gamma_output_mean"] == pytest.approx(statistics.fmean(qk), abs=1e-6)
        assert metrics["gamma_final_mean"] == pytest.approx(per_vector["final_scale"], abs=1e-6)
        assert metrics["gamma_mean"] == pytest.approx(statistics.fmean(per_vector.values()), abs=1e-6)


def test_a_dose_moves_the_mean_of_the_kind_it_decays_and_not_the_others(runs):
    """Decay at 100x on input-norm γ shrinks the blocks' input γ and the final γ against no decay, and leaves the
    QK-norm γ where they were (to a fifth of that shrinkage); decay on output-norm γ does the converse."""
    std, wd_in, wd_out = (runs[k][0] for k in (("standard", "base"), ("wd_in", "dose"), ("wd_out", "dose")))

    def shrink(run, kind):
        return std[f"gamma_{kind}_mean"] - run[f"gamma_{kind}_mean"]

    assert shrink(wd_in, "input") > 0.1 and shrink(wd_in, "final") > 0.1, (std, wd_in)
    assert abs(shrink(wd_in, "output")) < shrink(wd_in, "input") / 5
    assert shrink(wd_out, "output") > 0.1, (std, wd_out)
    assert abs(shrink(wd_out, "input")) < shrink(wd_out, "output") / 5
    assert abs(shrink(wd_out, "final")) < shrink(wd_out, "output") / 5
