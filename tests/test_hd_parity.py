"""The parity probe of Hidden Decoding: its task and windows, the answer-token metrics, its ledger's premises, and
the committed part re-derived from its cells."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from scalelab.analysis import claims, hd_parity, hd_study
from scalelab.analysis import hd_premises as hdp
from scalelab.analysis.window_floor import expected_window_loss
from scalelab.data.loader import val_batches
from scalelab.data.parity_task import EVEN, ODD, PAUSE, SEP, ParityTask
from scalelab.model.hidden_decoding_answers import scored_targets
from scalelab.model.transformer import ModelOutput

ROOT = Path(__file__).resolve().parents[1]
LN2 = math.log(2)


@pytest.mark.parametrize("K, pauses", [(4, 0), (6, 6), (3, 1)])
def test_blocks_answer_the_parity_of_their_bits(K, pauses):
    task = ParityTask(K, pauses)
    blocks = task.tokens(np.random.default_rng(0), 50 * task.period + 3).reshape(-1, task.period)
    assert len(blocks) == 50 and set(np.unique(blocks[:, :K])) <= {0, 1}
    assert (blocks[:, K] == SEP).all() and (blocks[:, K + 1:K + 1 + pauses] == PAUSE).all()
    parity = blocks[:, :K].sum(1) % 2
    assert (blocks[:, -1] == np.where(parity == 1, ODD, EVEN)).all()
    assert 0.3 < parity.mean() < 0.7  # both answers occur
    with pytest.raises(ValueError, match="K=0"):
        ParityTask(0)


@pytest.mark.parametrize("K, pauses, blocks", [(4, 0, 2), (3, 2, 3)])
def test_aligned_windows_have_floor_zero_on_the_answer_and_blind_ln2(K, pauses, blocks):
    """The exact window floor (the window-floor recursion) of an aligned window is K ln 2 per block: only the bits
    cost; a model blind to the parity pays ln 2 more per block, on its answer. A window cut off the blocks is refused
    by the alignment check."""
    task, blind = ParityTask(K, pauses), ParityTask(K, pauses, blind=True)
    T = task.seq_len(blocks)
    floor = expected_window_loss(task, 0, task, {0: 1.0}, T)
    assert floor == pytest.approx(K * LN2 / task.period, rel=1e-9)
    assert expected_window_loss(task, 0, blind, {0: 1.0}, T) == pytest.approx((K + 1) * LN2 / task.period, rel=1e-9)
    n_val = 40 * task.period
    assert hd_parity.aligned(task, T, 10 * T, n_val)
    assert not hd_parity.aligned(task, T + 1, 10 * T, n_val)
    # the loader's validation windows are those: every one starts at a block's first bit
    tokens = task.tokens(np.random.default_rng(1), n_val)
    for x, y in val_batches(tokens, seq_len=T, val_tokens=10 * T, batch_size=4):
        assert (task.answer_targets(y).sum(1) == blocks).all()
        assert (x[:, 0] <= 1).all()


class Oracle(torch.nn.Module):
    """Logits that put all mass on the parity (or, `blind`, half on each answer) at every separator-or-pause
    position whose next token is the answer; elsewhere uniform."""

    def __init__(self, task: ParityTask, blind: bool = False) -> None:
        super().__init__()
        self.task, self.blind = task, blind

    def forward(self, x):
        B, T = x.shape
        logits = torch.zeros(B, T, 8)
        for b in range(B):
            parity = 0
            for t in range(T):
                tok = int(x[b, t])
                parity = parity ^ tok if tok <= 1 else parity
                if tok in (SEP, PAUSE):
                    # the next token is the answer iff this is the block's last filler
                    if self.blind:
                        logits[b, t, [EVEN, ODD]] = 30.0
                    else:
                        logits[b, t, ODD if parity else EVEN] = 30.0
                if tok in (EVEN, ODD):
                    parity = 0
        return ModelOutput(logits, None, None)


def test_answer_metrics_read_the_answer_tokens_only():
    task = ParityTask(4, pauses=1)
    T = task.seq_len(3)
    tokens = task.tokens(np.random.default_rng(0), 30 * T + 1)
    batches = val_batches(tokens, seq_len=T, val_tokens=20 * T, batch_size=8)
    exact = scored_targets(Oracle(task), batches, task.answer_targets)
    assert exact["answers"] == 20 * 3 and exact["answer_acc"] == 1.0 and exact["answer_loss"] < 1e-9
    blind = scored_targets(Oracle(task, blind=True), batches, task.answer_targets)
    assert blind["answer_loss"] == pytest.approx(LN2, abs=1e-6)
    with pytest.raises(ValueError, match="no target selected"):
        scored_targets(Oracle(task), batches, lambda y: y > 100)


# ------------------------------------------------------------------ the ledger and its premises
def _run(cells):
    return {"command": "run_parity.py", "positive_control": "pause",
            "params": {"cells": cells, "grid": [c for c in cells if c != "pause"],
                       "claims": {"sfa_fraction": 0.8, "level": 0.95}}}


def _write(folder: Path, results: dict[str, list[tuple[float, float]]], K: int = 6) -> None:
    """results: cell → per seed (answer loss, answer accuracy)."""
    meta = {"n1": (1, "sfa"), "pause": (1, "sfa"), "n2": (2, "sfa"), "n4": (4, "sfa"), "n2full": (2, "full")}
    (folder / "metrics" / f"k{K}").mkdir(parents=True)
    for cell, per_seed in results.items():
        for seed, (loss, acc) in enumerate(per_seed):
            m = {"cell": cell, "seed": seed, "K": K, "pauses": K if cell == "pause" else 0, "answer_loss": loss,
                 "answer_acc": acc, "n_streams": meta[cell][0], "attention": meta[cell][1], "params": 1000,
                 "tokens": 10_000, "steps": 100, "cpu_s": 1.0}
            (folder / "metrics" / f"k{K}" / f"{cell}-{seed}.json").write_text(json.dumps(m))


CELLS = {"n1": {"n_streams": 1}, "n2": {"n_streams": 2}, "n4": {"n_streams": 4},
         "n2full": {"n_streams": 2, "attention": "full"}, "pause": {"n_streams": 1}}


def test_the_parity_ledger_waits_for_its_positive_control_and_room(tmp_path):
    near_blind, solved = [(0.69, 0.5), (0.688, 0.52), (0.692, 0.49)], [(0.01, 1.0), (0.02, 0.995), (0.005, 1.0)]
    half = [(0.35, 0.8), (0.30, 0.85), (0.40, 0.75)]
    good = {"n1": near_blind, "pause": solved, "n2": half, "n4": solved, "n2full": solved}
    _write(tmp_path / "ok", good)
    entries = {e["id"]: e for e in hd_parity.entries(tmp_path / "ok", _run(CELLS))}
    assert entries["C.parity.gain.n2"]["verdict"] == "reproduced"
    assert entries["C.parity.grows.n2-n4"]["verdict"] == "reproduced"
    # SFA at n = 2 keeps about half of full attention's gain: below 80%, contradicted
    assert entries["C.parity.sfa.n2"]["verdict"] == "contradicted"
    assert {p["name"] for p in entries["C.parity.gain.n2"]["premises"]} == {"room", "positive control"}

    failed_control = good | {"pause": [(0.01, 1.0), (0.69, 0.5), (0.01, 1.0)]}
    _write(tmp_path / "nocontrol", failed_control)
    for e in hd_parity.entries(tmp_path / "nocontrol", _run(CELLS)):
        assert e["verdict"].startswith("untested (positive control: pause tokens: answer accuracy 0.500"), e
    no_room = good | {"n1": [(0.3, 0.9), (0.2, 0.95), (0.25, 0.9)]}
    _write(tmp_path / "noroom", no_room)
    assert all(e["verdict"].startswith("untested (room: ")
               for e in hd_parity.entries(tmp_path / "noroom", _run(CELLS)))
    no_pause = {k: v for k, v in good.items() if k != "pause"}
    _write(tmp_path / "nopause", no_pause)
    run = _run({k: v for k, v in CELLS.items() if k != "pause"}) | {"positive_control": None}
    assert all("positive control: none run" in e["verdict"] for e in hd_parity.entries(tmp_path / "nopause", run))


def test_the_largest_k_solved_is_read_per_seed(tmp_path):
    for K, res in ((4, [(0.01, 1.0), (0.3, 0.9)]), (6, [(0.69, 0.5), (0.69, 0.5)])):
        d = tmp_path / "metrics" / f"k{K}"
        d.mkdir(parents=True)
        for seed, (loss, acc) in enumerate(res):
            (d / f"n1-{seed}.json").write_text(json.dumps(
                {"cell": "n1", "seed": seed, "K": K, "pauses": 0, "answer_loss": loss, "answer_acc": acc,
                 "n_streams": 1, "attention": "sfa", "steps": 10, "cpu_s": 1.0}))
    s = json.loads(json.dumps(hd_parity.summary(tmp_path)))
    assert [r["largest_solved"] for r in s["cells"]] == [4, None]
    assert s["cells"][0]["solved"] == pytest.approx(hd_parity.closed(0.01) + hd_parity.closed(0.69))
    table = hd_parity.largest_table(s)
    assert "| n1 | 0 | 1 | sfa | – | 4 |" in table and "| n1 | 1 | 1 | sfa | – | none |" in table
    assert hdp.SOLVED == 0.99


def test_the_committed_parity_part_is_rederived():
    folder = ROOT / "results/hidden-decoding"
    plain = lambda x: json.loads(json.dumps(x))  # noqa: E731
    assert plain(hd_study.part_entries(folder, "parity")) == claims.read_claims(folder / "parity/claims.json")
    assert plain(hd_parity.summary(folder / "parity")) == json.loads((folder / "parity/summary.json").read_text())
    run = json.loads((folder / "parity/run.json").read_text())
    assert run["positive_control"] == hd_parity.PAUSE_CELL and hd_study.kind_of(run) == "parity"
    ledger = {e["id"]: e for e in claims.read_claims(folder / "claims_c.json")}
    assert {i for i in ledger if i.startswith("parity.")} == {f"parity.{e['id']}" for e in
                                                              claims.read_claims(folder / "parity/claims.json")}


# ------------------------------------------------------------------ mutation checks (tests/mutants.py)
from mutants import mutant, mutation_checks  # noqa: E402


@mutant("hd-parity-control-off")  # the pause-token control read as passed whatever its accuracy
def _(monkeypatch):
    real = hdp.parity_premises

    def lenient(K, pause_acc, n1_closed):
        room, control = real(K, pause_acc, n1_closed)
        return [room, control | {"passed": True}]

    monkeypatch.setattr(hdp, "parity_premises", lenient)


@mutant("hd-parity-alignment-unchecked")  # any window length taken as aligned to the blocks
def _(monkeypatch):
    monkeypatch.setattr(hd_parity, "aligned", lambda *a: True)


@mutant("hd-answers-every-target")  # the answer metrics averaged over every target, bits included
def _(monkeypatch):
    import scalelab.model.hidden_decoding_answers as answers

    real = answers.scored_targets
    monkeypatch.setattr(answers, "scored_targets", lambda model, batches, select: real(
        model, batches, lambda y: torch.ones_like(y, dtype=torch.bool)))
    monkeypatch.setitem(globals(), "scored_targets", answers.scored_targets)


P = "tests/test_hd_parity.py::"
CAUGHT = [
    ("hd-parity-control-off", f"{P}test_the_parity_ledger_waits_for_its_positive_control_and_room"),
    ("hd-parity-alignment-unchecked", f"{P}test_aligned_windows_have_floor_zero_on_the_answer_and_blind_ln2"),
    ("hd-answers-every-target", f"{P}test_answer_metrics_read_the_answer_tokens_only"),
]


test_a_broken_parity_probe_is_caught = mutation_checks(CAUGHT)
