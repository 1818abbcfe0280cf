"""The GPU path rehearsed on CPU: each GPU preset in configs/ runs end to end as a micro version built from
the preset file itself, with the preset's own precision, compile, strategy, mixing, position and calibration flags;
only dimensions, steps, data and the device are shrunk (`micro`). A flag the code silently ignored fails here: the
model must really be compiled, the matmuls of a training step must run in bf16, two gloo processes must train as DDP,
a Hidden Decoding cell must be saved with the preset's stream settings, calibration must hold float64 Gram matrices
of at most `blocks_per_pass` blocks at a time, as at 8B. Each result is evaluated as the evaluate stage would.

    pytest -m rehearsal
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from mutants import mutant, mutation_checks

from scalelab.config import parse_params
from scalelab.tracking.teamserver import free_port

pytestmark = pytest.mark.rehearsal
ROOT = Path(__file__).resolve().parents[1]
PRESETS = {p.stem: p for p in sorted((ROOT / "configs").glob("gpu-*.yaml"))}
MICRO_DIMS = {"n_layer": 2, "d_model": 32, "n_head": 2, "n_kv_head": 2, "d_ff": 64}


def preset(name: str) -> dict:
    """The preset file with its `machine:` section (its devices, compile, ...) merged into the sections, as
    `parse_params` does (scalelab.config.machine): the micro versions override those settings inline."""
    from scalelab.config import machine

    from scalelab.config.params import read_yaml

    return machine.resolve(read_yaml(PRESETS[name]), str(PRESETS[name]))  # composed over its base


def micro(raw: dict, *, devices: int = 1) -> dict:
    """The preset `raw` at micro scale on CPU: every size of micro dimensions, a few steps of a short sequence, one
    thread, the CPU. Everything else (precision, compile, strategy, accumulation, clipping, the model's and the
    methods' flags) stays the preset's."""
    raw = copy.deepcopy(raw)
    raw["model"]["sizes"] = {k: dict(MICRO_DIMS) for k in raw["model"]["sizes"]}
    if raw["model"].get("moe"):
        raw["model"]["moe"] = {**raw["model"]["moe"], "d_expert": 32}
    pre = raw["pretrain"]
    pre.update(seq_len=32, batch_size=4 * devices * min(pre["accumulate"], 2), accumulate=min(pre["accumulate"], 2),
               max_tokens=None, max_steps=4, val_every=2, val_tokens=512, ckpt_every=2, accelerator="cpu",
               devices=devices, num_nodes=1, threads=1, peak_flops=1e11, gamma_every=2,
               sharpness={**pre["sharpness"], "tokens": 4096, "max_iters": 2, "every": None})
    return raw


def test_every_gpu_preset_is_rehearsed():
    """A preset added to configs/ without a rehearsal here fails: the three are the ones this file runs."""
    assert set(PRESETS) == {"gpu-0.12b", "gpu-hidden-decoding", "gpu-compress-8b"}
    for name in PRESETS:  # and each parses at full size, as `make profile P=...` would copy it
        parse_params(preset(name))


# ------------------------------------------------------------------ pretraining: torch.compile, bf16-mixed, DDP
class Probe:
    """What a training step really ran: autocast's state inside LitLM.training_step (which Lightning's precision
    plugin enters, and the compiled graph is traced under), the dtype of a linear map's output computed eagerly in
    that same context, and whether the module is compiled."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def install(self, monkeypatch, module) -> None:
        probe, base = self, module.LitLM

        class Probed(base):
            def training_step(self, batch, batch_idx):
                if not probe.seen:
                    linear = next(m for m in self.model.modules() if isinstance(m, torch.nn.Linear))
                    x = torch.randn(2, linear.in_features, device=self.device)
                    probe.seen.append({"autocast": torch.is_autocast_enabled(self.device.type),
                                       "autocast_dtype": torch.get_autocast_dtype(self.device.type),
                                       "matmul_dtype": linear(x).dtype,
                                       "compiled": getattr(self.model, "_compiled_call_impl", None) is not None})
                return super().training_step(batch, batch_idx)

        monkeypatch.setattr(module, "LitLM", Probed)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    from test_train import make_shards

    return make_shards(tmp_path_factory.mktemp("tokens"), n_train=8000, n_val=1200)


def _cell(raw: dict):
    from scalelab.train import Cell

    g = raw["pretrain"]["grid"]
    size = "m" if "m" in g["sizes"] else g["sizes"][-1]  # the 0.12B shape's cell, at micro dimensions
    return Cell("unified" if "unified" in g["variants"] else g["variants"][0], size, "base", 0)


def test_pretrain_preset_compiles_and_trains_in_bf16(tmp_path, shards, monkeypatch):
    """gpu-0.12b's pretraining (compile: true, bf16-mixed) through `fit`, then its export evaluated: the module is
    compiled and dynamo really built graphs of it; the step runs under bf16 autocast with bf16 matmuls; the loss is
    finite and the exported model scores the validation windows as training did."""
    import torch._dynamo

    from scalelab.evaluate.lm import load_lm
    from scalelab.evaluate.perplexity import perplexity, val_windows
    fit_module = importlib.import_module("scalelab.train.fit")  # the module (scalelab.train.fit is also the function)

    raw = micro(preset("gpu-0.12b"))
    params = parse_params(raw)
    assert params.pretrain.compile and params.pretrain.precision == "bf16-mixed"  # the preset's, not ours
    probe = Probe()
    probe.install(monkeypatch, fit_module)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    metrics = fit_module.fit(params, _cell(raw), tmp_path / "out", shards)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert metrics["steps"] == 4 and torch.isfinite(torch.tensor(metrics["val_loss"]))
    seen = probe.seen[0]
    assert seen["compiled"] and graphs >= 1, (seen, dict(torch._dynamo.utils.counters["stats"]))
    assert seen["autocast"] and seen["autocast_dtype"] == torch.bfloat16 and seen["matmul_dtype"] == torch.bfloat16
    # evaluated as the evaluate stage loads it (scalelab's own format), on the validation windows of training
    tok = _ids_tokenizer(tmp_path, 256)
    lm = load_lm(tmp_path / "out/model", "micro-0.12b", dtype=params.evaluate.dtype, tokenizer_fallback=tok)
    batches, source = val_windows(lm, shards_dir=shards, val_text=[], tokenizer_json=tok, seq_len=32, val_tokens=512,
                                  batch_size=4)
    scored = perplexity(lm, batches)
    assert source == "shards" and scored["val_tokens"] == 512
    assert abs(scored["val_loss"] - metrics["val_loss"]) < 0.05  # bf16 weights here, bf16-mixed in training


@pytest.mark.timeout(900)
def test_pretrain_preset_runs_as_ddp_on_two_gloo_processes(tmp_path, shards):
    """gpu-0.12b's strategy (ddp) with 2 CPU processes through the CLI that Lightning's launcher re-executes, with
    the preset's compile and bf16-mixed: both ranks train the same steps and rank 0 writes the model."""
    raw = micro(preset("gpu-0.12b"), devices=2)
    assert raw["pretrain"]["strategy"] == "ddp" and raw["pretrain"]["compile"]
    # compile is rehearsed in one process above, so the DDP rehearsal runs the preset's strategy and precision eagerly
    # (the suite's time). Its hangs in CI (rank 1 never started) were the in-process fit above leaving LOCAL_RANK in
    # this process's environment, which told this child's launcher that its ranks were started externally
    # (placement.launch_scope; test_ddp.test_an_in_process_ddp_fit_leaves_no_rank_variables)
    raw["pretrain"]["compile"] = False
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(raw))
    cell = _cell(raw)
    cmd = [sys.executable, "-m", "scalelab.train.fit", "--params", str(tmp_path / "ddp.yaml"), "--variant",
           cell.variant, "--size", cell.size, "--recipe", cell.recipe, "--seed", "0", "--out", str(tmp_path / "two"),
           "--shards", str(shards)]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # as test_ddp
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=860, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    two = json.loads(res.stdout.strip().splitlines()[-1])
    assert two["steps"] == 4 and torch.isfinite(torch.tensor(two["val_loss"]))
    assert two["peak_flops"] == 2 * raw["pretrain"]["peak_flops"]  # the MFU denominator counts both devices
    assert json.loads((tmp_path / "two/model/metrics.json").read_text())["val_loss"] == two["val_loss"]


@mutant("rehearsal-compile-ignored")
def _(monkeypatch):  # fit drops the compile flag
    fit_module = importlib.import_module("scalelab.train.fit")  # the module (scalelab.train.fit is also the function)

    monkeypatch.setattr(fit_module.Transformer, "compile", lambda self, *a, **k: None)


@mutant("rehearsal-precision-ignored")
def _(monkeypatch):  # fit trains in fp32 whatever the preset says
    import lightning as L

    fit_module = importlib.import_module("scalelab.train.fit")  # the module (scalelab.train.fit is also the function)

    real = L.Trainer

    def trainer(*a, **k):
        return real(*a, **{**k, "precision": "32-true"})

    monkeypatch.setattr(fit_module.L, "Trainer", trainer)


test_the_pretrain_rehearsal_catches = mutation_checks([
    (m, "tests/test_rehearsal.py::test_pretrain_preset_compiles_and_trains_in_bf16")
    for m in ("rehearsal-compile-ignored", "rehearsal-precision-ignored")])


# ------------------------------------------------------------------ the cost table and the device script
def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_cost_table_is_the_scripts_output():
    """docs/scale.md's table is benchmarks/preset_costs.py's output for the presets as they are now: a preset changed
    without `--write` fails here."""
    costs = _bench("preset_costs")
    assert costs.committed() == costs.table()


def test_cost_rows_follow_the_preset_not_a_typed_number(tmp_path):
    """Doubling a preset's steps doubles its tokens, FLOPs and hours; a larger calibration pass stores its blocks'
    Gram matrices (float64, as collect does): 4 blocks of 8B width ≈ 2 GB each."""
    costs = _bench("preset_costs")
    raw = preset("gpu-hidden-decoding")
    (tmp_path / "gpu-hidden-decoding.yaml").write_text(yaml.safe_dump(raw))
    base = {r["stage"]: r for r in costs.rows_of(tmp_path / "gpu-hidden-decoding.yaml")}
    raw["hidden_decoding"]["train"]["max_steps"] *= 2
    (tmp_path / "gpu-hidden-decoding.yaml").write_text(yaml.safe_dump(raw))
    for r in costs.rows_of(tmp_path / "gpu-hidden-decoding.yaml"):
        b = base[r["stage"]]
        # (a FLOP-matched control's steps are rounded to a whole step)
        assert r["tokens"] == pytest.approx(2 * b["tokens"], rel=1e-3)
        assert r["flops"] == pytest.approx(2 * b["flops"], rel=1e-3)
        assert r["hours"] == pytest.approx(2 * b["hours"], rel=1e-3) and r["mem"] == b["mem"]
    c = {r["stage"].split()[1]: r for r in costs.rows_of(PRESETS["gpu-compress-8b"])}
    d, ff = 4096, 14336
    per_block = 8 * (3 * d * d + ff * ff)
    bpp = preset("gpu-compress-8b")["compress"]["calibration"]["blocks_per_pass"]
    assert c["svd"]["mem"]["calibration"] == bpp * per_block
    assert c["sigmascale"]["hours"] > 10 * c["svd"]["hours"]  # the SVD steps dominate


def test_gpu_check_skips_cleanly_without_cuda():
    """Without CUDA the device script exits 0 at once with one JSON line saying it skipped."""
    assert not torch.cuda.is_available()
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py")], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 1 and "no CUDA" in json.loads(lines[0])["skipped"]


# ------------------------------------------------------------------ Hidden Decoding with the preset's stream settings
def _rehearsed_cells(hd) -> list[str]:
    """The preset's widest SFA cell, its full-attention cell, and one FLOP-matched control: every code path of the
    grid (the other cells differ from these in n only)."""
    plain = [c for c in hd.grid if hd.cells[c].flops_of is None]
    picks = [max((c for c in plain if hd.cells[c].attention == "sfa"), key=lambda c: hd.cells[c].n_streams)]
    picks += [c for c in plain if hd.cells[c].attention == "full"][:1]
    picks += [c for c in hd.grid if hd.cells[c].flops_of is not None][:1]
    return picks


def test_hidden_decoding_preset_cells_train_with_its_stream_settings(tmp_path, monkeypatch):
    """gpu-hidden-decoding's cells through `fit_cell` on a tiny Qwen3 backbone (the preset's family; 8 layers so the
    default mixing layers 3 and 7 exist): each is saved with exactly the preset's stream configuration (n, attention,
    positions, mixing layers and whatever else the preset's section sets), trains under the preset's bf16-mixed, and
    loads and scores as the evaluate stage would."""
    from test_hidden_decoding import V, _write_shards
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from scalelab.config import HiddenDecodingConfig
    from scalelab.evaluate.lm import load_lm
    from scalelab.evaluate.perplexity import perplexity, val_windows
    hd_module = importlib.import_module("scalelab.hidden_decoding.train")

    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 tie_word_embeddings=True)).save_pretrained(tmp_path / "backbone")
    _write_shards(tmp_path / "tokens")
    tok = _ids_tokenizer(tmp_path, V)  # beside the weights, as a real backbone's: the vocabulary check reads it
    PreTrainedTokenizerFast(tokenizer_file=str(tok), eos_token="<0>").save_pretrained(tmp_path / "backbone")
    section = copy.deepcopy(preset("gpu-hidden-decoding")["hidden_decoding"])
    section["source"] = {"path": str(tmp_path / "backbone"), "dtype": section["source"].get("dtype", "float32")}
    section["source_dep"] = str(tmp_path / "backbone")
    tr = section["train"]
    tr.update(seq_len=16, batch_size=4 * min(tr["accumulate"], 2), accumulate=min(tr["accumulate"], 2), max_steps=2,
              val_every=2, val_tokens=256, ckpt_every=2, accelerator="cpu", devices=1, num_nodes=1, threads=1,
              peak_flops=1e11, corpus="shards")  # the micro token shards are in the micro backbone's vocabulary
    hd = HiddenDecodingConfig.model_validate(section)
    assert hd.train.precision == "bf16-mixed"
    for cell in _rehearsed_cells(hd):
        probe = Probe()
        probe.install(monkeypatch, hd_module)
        metrics = hd_module.fit_cell(hd, cell, 0, tmp_path / cell, tmp_path / "tokens")
        want = hd.model(cell)
        saved = json.loads((tmp_path / cell / "model/hidden_decoding.json").read_text())
        assert saved["model"] == want.model_dump(mode="json"), cell  # every stream setting, as the preset says
        mixing = sorted(want.mixing(8)) if want.n_streams > 1 else []  # one stream has nothing to mix
        assert saved["mixing_layers"] == metrics["mixing_layers"] == mixing and metrics["n_streams"] == want.n_streams
        seen = probe.seen[0]
        assert seen["autocast"] and seen["autocast_dtype"] == torch.bfloat16 and seen["matmul_dtype"] == torch.bfloat16
        lm = load_lm(tmp_path / cell / "model", cell, tokenizer_fallback=tok)
        assert lm.kind == f"hidden_decoding:n={want.n_streams}"
        batches, _ = val_windows(lm, shards_dir=tmp_path / "tokens", val_text=[], tokenizer_json=tok, seq_len=16,
                                 val_tokens=256, batch_size=4)
        # the stage's validation ran under bf16 autocast; this evaluation in float32
        assert perplexity(lm, batches)["val_loss"] == pytest.approx(metrics["val_loss"], abs=0.05), cell


def _ids_tokenizer(tmp: Path, vocab: int) -> Path:
    """A tokenizer.json whose ids are the shards' 0..vocab-1 (the micro shards have no text)."""
    from tokenizers import Tokenizer, models

    path = tmp / f"ids-{vocab}.json"
    Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab)}, unk_token="<0>")).save(str(path))
    return path


@mutant("rehearsal-hd-positions-ignored")
def _(monkeypatch):  # the trainer builds the model with another position rule than the preset's
    hd_module = importlib.import_module("scalelab.hidden_decoding.train")
    real = hd_module.from_source

    def built(source, cfg, device):
        return real(source, cfg.model_copy(update={"positions": "interleaved" if cfg.positions == "shared"
                                                   else "shared"}), device)
    monkeypatch.setattr(hd_module, "from_source", built)


# ------------------------------------------------------------------ compression with the preset's calibration
def test_compress_preset_calibrates_as_at_8b_and_its_result_evaluates(tmp_path, monkeypatch):
    """gpu-compress-8b's methods through `run_seed` on a tiny Llama (the preset's family) whose layer width keeps 8B's
    d_ff/d = 3.5 and q/k/v width = d: calibration statistics are float64 Gram matrices, one per distinct input of a
    block (q/k/v share one, gate/up share one), and at most `blocks_per_pass` blocks of them exist at once, exactly as
    benchmarks/preset_costs.py counts them at 8B. The compressed model loads and is evaluated (perplexity, and the
    zero-shot scorer on its key/value cache equal to full sequences)."""
    import weakref

    from evaldata import make_data
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from scalelab.compress import calibrate, cells
    from scalelab.config.compress import CompressConfig
    from scalelab.evaluate import zeroshot
    from scalelab.evaluate.lm import load_lm
    from scalelab.evaluate.perplexity import perplexity, val_windows

    val = make_data(tmp_path)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "data/tokenizer/tokenizer.json"),
                                  eos_token="<|endoftext|>")
    d, ff, layers = 32, 112, 6
    torch.manual_seed(0)
    folder = tmp_path / "Llama-micro"
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=d, intermediate_size=ff, num_hidden_layers=layers,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                 tie_word_embeddings=False)).save_pretrained(folder)
    tok.save_pretrained(folder)
    section = copy.deepcopy(preset("gpu-compress-8b")["compress"])
    bpp = section["calibration"]["blocks_per_pass"]
    assert 1 <= bpp < layers  # more than one pass here, as at 8B
    section.update(source={**section["source"], "path": str(folder)}, source_dep=str(folder), device="cpu", threads=1)
    section["calibration"].update(samples=8, seq_len=32, batch_size=4, max_text_tokens=20000)
    section["sigmascale"].update(max_steps=3, patience=2)
    section["refine"].update(steps=2, batch_size=2)
    # offline: the evaluation split is the prepared corpus instead of the preset's hub split (WikiText-2 test)
    section["eval"].update(seq_len=32, val_tokens=512, batch_size=4, hub=None)
    section["allocation"]["samples"] = min(section["allocation"]["samples"], 2)
    chosen = CompressConfig.model_validate(section)
    methods = sorted(m for m in chosen.grid.methods if chosen.methods[m].kind == "sigmascale")[:1]
    methods += [m for m in chosen.grid.methods if chosen.methods[m].refine != "none"][:1]
    assert methods
    # one seed's cells share one calibration (compress/shared.py): the two methods at the preset's largest kept
    # fraction, saved as the stage saves them
    section.update(grid={"methods": methods, "keep": [chosen.grid.keep[-1]], "seeds": [0]}, save_models=True)
    cfg = CompressConfig.model_validate(section)
    live, peak, dtypes = {}, [0], set()

    class Tracked(calibrate.Stats):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            key = id(self)
            live[key] = self.gram.numel() * self.gram.element_size()
            dtypes.add((self.gram.dtype, tuple(self.gram.shape)))
            peak[0] = max(peak[0], sum(live.values()))
            weakref.finalize(self, live.pop, key, None)

    monkeypatch.setattr(calibrate, "Stats", Tracked)
    monkeypatch.chdir(tmp_path)  # the stage's working directory: data/prepared is read relative to it
    results = cells.run_seed(cfg, 0, tmp_path / "out")
    assert dtypes == {(torch.float64, (d, d)), (torch.float64, (ff, ff))}, dtypes
    assert peak[0] == bpp * 8 * (3 * d * d + ff * ff), peak[0]  # preset_costs' calibration memory
    assert [m["method"] for m, _ in results] == methods
    for (metrics, records), method in zip(results, methods):
        assert len(records) == 7 * layers and torch.isfinite(torch.tensor(metrics["val_nll"]))
        lm = load_lm(tmp_path / "out" / metrics["cell"] / "model", method)
        assert lm.kind.startswith("hf:scalelab_lowrank_") and lm.masked is not None
        batches, source = val_windows(lm, shards_dir=tmp_path / "data/tokens", val_text=val,
                                      tokenizer_json=tmp_path / "data/tokenizer/tokenizer.json", seq_len=32,
                                      val_tokens=256, batch_size=4)
        assert source == "shards" and torch.isfinite(torch.tensor(perplexity(lm, batches)["val_loss"]))
        items = zeroshot.continuation_items(val, 4, 4, 60, seed=0)
        shared, full = (zeroshot.choice_scores(lm, items, 8, shared=s) for s in (True, False))
        assert [v for s in shared for v, _ in s] == pytest.approx([v for s in full for v, _ in s], abs=1e-4)


@mutant("rehearsal-all-blocks-at-once")
def _(monkeypatch):  # calibration ignores blocks_per_pass and streams every block's statistics in one pass
    from scalelab.compress import cells

    real = cells.Calibration
    monkeypatch.setattr(cells, "Calibration", lambda *a, **k: real(*a, **{**k, "blocks_per_pass": 0}))


test_the_preset_rehearsals_catch = mutation_checks([
    ("rehearsal-hd-positions-ignored",
     "tests/test_rehearsal.py::test_hidden_decoding_preset_cells_train_with_its_stream_settings"),
    ("rehearsal-all-blocks-at-once",
     "tests/test_rehearsal.py::test_compress_preset_calibrates_as_at_8b_and_its_result_evaluates")])
