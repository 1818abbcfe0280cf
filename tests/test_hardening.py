"""Fault-injection hardening: each test replays one failure found by killing, corrupting and mistyping,
and checks the guarantee the README's "Reliability" section states."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import get_args

import networkx as nx
import numpy as np
import pytest
import yaml
from conftest import MICRO, ROOT
from lightning.pytorch.callbacks import Callback
from mlflow import MlflowClient
from mutants import assert_caught, mutant, mutation_checks
from test_tracking import db, project  # noqa: F401  (fixtures: a shared sqlite store, a project root per test)
from test_train import FailAt, make_shards, micro_raw
from workspace import workspace_copy

from scalelab import tracking
from scalelab.config import CorpusConfig, ParamsError, PrepareConfig, PretrainConfig, load_params, parse_params
from scalelab.data import DataError
from scalelab.train import Cell, config_hash, fit, resume_run_id
from scalelab.runtime import yamlio

DVC = [sys.executable, "-m", "dvc"]


def _run(cmd, cwd, env, check=True):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if check and res.returncode:
        raise AssertionError(f"{cmd} failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
    return res


def _scenes(first: int, n: int) -> str:
    return "".join(f"### SCENE {i}\nThe {i}th scene: a line of verse, and another line {i * 7}.\n"
                   for i in range(first, first + n))


@pytest.fixture(scope="module")
def dvc_ws(tmp_path_factory):
    """A git + DVC copy of the project on the micro profile with a local corpus; `prepare` already ran."""
    ws = tmp_path_factory.mktemp("ws")
    params = yamlio.safe_load(MICRO.read_text())
    params["prepare"]["corpus"] = {**params["prepare"]["corpus"], "source": "local", "path": "mycorpus",
                                   "max_documents": None}
    (ws.parent / "local_params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = workspace_copy(ws, ws.parent / "local_params.yaml") | {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}
    (ws / "mycorpus").mkdir()
    (ws / "mycorpus" / "a.md").write_text(_scenes(0, 40))
    (ws / "mycorpus" / "b.md").write_text(_scenes(40, 40))
    _run(DVC + ["repro", "prepare"], ws, env)
    return ws, env


def _changed(ws, env) -> set[str]:
    out = _run(DVC + ["status"], ws, env).stdout
    return {line.rstrip(":").strip() for line in out.splitlines() if line and not line[0].isspace()
            and line.rstrip().endswith(":")}


# ---------------------------------------------------------------- 1. a changed local corpus is seen
@pytest.mark.slow  # DVC stages in a workspace copy
def test_a_changed_local_corpus_reruns_prepare(dvc_ws):
    ws, env = dvc_ws
    assert "prepare" not in _changed(ws, env)
    with open(ws / "mycorpus" / "b.md", "a") as f:
        f.write("### SCENE 999\nA line appended to the corpus.\n")
    assert "prepare" in _changed(ws, env)
    _run(DVC + ["repro", "prepare"], ws, env)
    assert "prepare" not in _changed(ws, env)
    prepared = json.loads((ws / "metrics/prepare.json").read_text())
    assert prepared["train"]["documents"] + prepared["val"]["documents"] == 81


def test_hub_revision_is_passed_and_recorded(tmp_path, monkeypatch):
    """A hub corpus is pinned to `hub_revision` (DVC tracks the param) and the revision lands in the metrics."""
    import datasets

    from scalelab.data import prepare_corpus

    seen = {}

    def fake_load(path, name=None, split=None, streaming=False, revision=None, **kw):
        seen.update(path=path, revision=revision)
        return datasets.Dataset.from_dict({"text": [f"document {i}" for i in range(50)]})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    cfg = PrepareConfig(corpus=CorpusConfig(source="hub", hub_id="org/corpus", hub_revision="0123abcd"),
                        val_fraction=0.2)
    stats = prepare_corpus(cfg, tmp_path)
    assert seen == {"path": "org/corpus", "revision": "0123abcd"}
    assert stats["source"]["hub_revision"] == "0123abcd" and stats["source"]["hub_id"] == "org/corpus"


# ---------------------------------------------------------------- 2. a params typo never deletes results
@pytest.mark.slow  # DVC stages in a workspace copy
def test_a_params_typo_never_deletes_results(dvc_ws):
    ws, env = dvc_ws
    kept = {p: (ws / p).read_bytes() for p in ("data/prepared/train.parquet", "metrics/prepare.json")}
    good = (ws / "params.yaml").read_text()
    raw = yamlio.safe_load(good)
    raw["prepare"]["val_fractoin"] = 0.1
    (ws / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        res = _run(DVC + ["repro"], ws, env, check=False)
    finally:
        (ws / "params.yaml").write_text(good)
    assert res.returncode != 0 and "prepare.val_fractoin: unknown key" in res.stdout + res.stderr
    assert "Running stage 'prepare'" not in res.stdout
    assert {p: (ws / p).read_bytes() for p in kept} == kept
    _run(DVC + ["repro", "prepare"], ws, env)  # the fixed params: the check passes, prepare stays cached
    assert {p: (ws / p).read_bytes() for p in kept} == kept


@pytest.mark.slow  # DVC stages in a workspace copy
def test_an_injected_name_never_reaches_a_shell(dvc_ws):
    ws, env = dvc_ws
    good = (ws / "params.yaml").read_text()
    raw = yamlio.safe_load(good)
    evil = "x;touch pwned;#"
    raw["model"]["variants"][evil] = {}
    raw["pretrain"]["grid"]["variants"] = [evil]
    (ws / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    try:
        res = _run(DVC + ["repro", f"pretrain@{evil}-a-0"], ws, env, check=False)
        assert res.returncode != 0 and "model.variants" in res.stdout + res.stderr
        assert not (ws / "pwned").exists()
    finally:
        (ws / "params.yaml").write_text(good)


def test_every_stage_runs_after_the_params_check():
    """DVC runs a stage's upstream first and stops at the first failure: with `validate` upstream of every stage,
    `dvc repro` and the Prefect flow (which orders its tasks by the same graph) stop before removing any outs."""
    from dvc.repo import Repo
    from dvc.stage import PipelineStage

    with Repo(str(ROOT)) as repo:
        stages = [s for s in repo.index.stages if isinstance(s, PipelineStage)]
        graph = repo.index.graph
        (validate,) = [s for s in stages if s.addressing == "validate"]
        orphans = [s.addressing for s in stages if s is not validate and validate not in nx.descendants(graph, s)]
    assert not orphans


def test_make_repro_checks_params_before_dvc():
    """`make repro` is `scalelab repro`, which runs the params check before the flow (tests/test_cli.py); nothing in
    the recipe starts DVC or the flow before it."""
    out = _run(["make", "-n", "repro"], ROOT, os.environ).stdout.splitlines()
    first = next(i for i, line in enumerate(out) if "scalelab repro" in line)
    assert not any("dvc repro" in line or "flows/pipeline.py" in line for line in out[:first])


# ---------------------------------------------------------------- 7. one line per user error, an exit code per kind
def _check(params_file, capsys, *extra):
    from scalelab.pipeline import check

    rc = check.main(["--params", str(params_file), *extra])
    err = capsys.readouterr().err.strip()
    return rc, err


def _write(tmp_path, raw, name="params.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False) if isinstance(raw, dict) else raw)
    return path


@pytest.mark.parametrize("mutate,needle", [
    (lambda r: r["prepare"].update(val_fractoin=0.1), r"prepare\.val_fractoin: unknown key"),
    (lambda r: r["model"]["sizes"]["a"].update(n_head=3), r"model\.sizes\.a: d_model \(32\) must be divisible by n_head"),
    (lambda r: r["optim"]["adamw"].update(lr=float("inf")), r"optim\.adamw\.lr"),
    (lambda r: r["optim"]["adamw"].update(betas=[0.9, float("nan")]), r"optim\.adamw\.betas"),
    (lambda r: r["pretrain"].update(val_tokens=16), r"pretrain: val_tokens \(16\) .*seq_len \(32\)"),
    (lambda r: r["pretrain"]["recipes"].update({"a b": {"optimizer": "adamw"}}), r"pretrain\.recipes\.a b"),
    (lambda r: r["optim"].update({"$(id)": {"name": "adamw"}}), r"optim\.\$\(id\)"),
    (lambda r: r["pretrain"]["grid"].update(recipe_sizes=["a;b"]), r"pretrain\.grid\.recipe_sizes\.0: invalid name"),
    (lambda r: r["optim"]["galore"]["kwargs"].update(rank_ratio="not-a-number"),
     r"optim\.galore\.kwargs: rank_ratio: Input should be a valid number"),
])
def test_params_errors_are_one_line_with_the_key_path(tmp_path, capsys, mutate, needle):
    raw = yamlio.safe_load(MICRO.read_text())
    mutate(raw)
    rc, err = _check(_write(tmp_path, raw), capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and re.search(needle, err), err


def test_a_value_the_library_refuses_fails_the_check(tmp_path, capsys):
    """Of the type the schema asks, refused by the optimizer's constructor: `scalelab check` builds each optimizer of
    `optim` as a stage would, on a one-matrix model, so it fails there with one line naming the optimizer."""
    for mutate, needle in ((lambda r: r["optim"]["sophia"]["kwargs"].update(p=-1.0),
                            r"^check: optim\.sophia: sophia refuses these settings: p \(gradient clip\) must be"),
                           (lambda r: r["optim"]["sgd"].update(kwargs={"dampening": 0.5}),
                            r"^check: optim\.sgd: sgd refuses these settings: Nesterov momentum requires")):
        raw = yamlio.safe_load(MICRO.read_text())
        mutate(raw)
        rc, err = _check(_write(tmp_path, raw), capsys)
        assert rc == 2 and len(err.splitlines()) == 1 and re.search(needle, err), err


@mutant("optimizers-not-built")  # `scalelab check` checks the schema only: a value the library refuses passes
def _(monkeypatch):
    from scalelab.pipeline import check

    monkeypatch.setattr(check, "build_optimizers", lambda optim: None)


test_the_check_builds_the_optimizers = mutation_checks([
    ("optimizers-not-built", "tests/test_hardening.py::test_a_value_the_library_refuses_fails_the_check"),
])


def test_yaml_syntax_error_is_one_line_with_its_position(tmp_path, capsys):
    text = MICRO.read_text().replace("seq_len: 32", "seq_len: [32")
    rc, err = _check(_write(tmp_path, text), capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and re.search(r"params\.yaml line \d+", err), err
    with pytest.raises(ParamsError, match="YAML"):
        load_params(tmp_path / "params.yaml")


def test_data_errors_found_before_any_stage_runs(tmp_path, capsys):
    raw = yamlio.safe_load(MICRO.read_text())
    raw["prepare"]["corpus"].update(source="local", path=str(tmp_path / "nowhere"))
    rc, err = _check(_write(tmp_path, raw), capsys)
    assert rc == 3 and len(err.splitlines()) == 1 and "nowhere" in err, err
    # with shards present: a seq_len longer than the validation shard
    raw = yamlio.safe_load(MICRO.read_text())
    raw["pretrain"].update(seq_len=128, val_tokens=4096)
    make_shards(tmp_path / "tokens", n_train=2000, n_val=100)
    rc, err = _check(_write(tmp_path, raw), capsys, "--shards", str(tmp_path / "tokens"))
    assert rc == 3 and len(err.splitlines()) == 1 and "seq_len 128" in err, err
    rc, err = _check(MICRO, capsys)
    assert rc == 0, err


def test_check_runs_as_a_module():
    res = subprocess.run([sys.executable, "-m", "scalelab.pipeline.check", "--params", str(MICRO)], capture_output=True,
                         text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "params valid" in res.stdout


def test_nonfinite_loss_is_one_line_and_its_own_exit_code(tmp_path, capsys):
    from scalelab.pipeline.stage import EXIT_NONFINITE, stage_main

    shards = make_shards(tmp_path / "tokens", n_train=4000, n_val=400)
    # not named params.yaml: the micro params carry this machine's settings inline, which only DVC's file refuses
    path = _write(tmp_path, micro_raw(max_steps=6, ckpt_every=3, val_every=3), name="cell.yaml")
    cell = Cell("standard", "a", "base", 0)
    rc = stage_main(lambda p: fit(p, cell, tmp_path / "out", shards, callbacks=[FailAt(4, poison=True)]),
                    str(path), name="pretrain")
    stderr = capsys.readouterr().err
    err = [line for line in stderr.splitlines() if line.startswith("pretrain:")]
    assert rc == EXIT_NONFINITE != 1 and "Traceback" not in stderr
    assert len(err) == 1 and "non-finite training values at step 4" in err[0]


# ---------------------------------------------------------------- 3. checks before the checkpoint is claimed
class FirstStep(Callback):
    def __init__(self):
        self.step = None

    def on_train_start(self, trainer, pl_module):
        self.step = pl_module.step


def _stage_fit(params, cell, out, shards, callbacks=()):
    """What the pretrain stage does: reopen the run of a resumable checkpoint, then fit."""
    with tracking.stage_run("pretrain-test", params={}, run_id=resume_run_id(out, config_hash(params, cell, shards))) \
            as run:
        return run.run_id, fit(params, cell, out, shards, run, callbacks=callbacks)


def test_a_failed_check_leaves_an_interrupted_checkpoint_resumable(tmp_path):
    shards = make_shards(tmp_path / "tokens", n_train=20_000, n_val=100)  # 99 val tokens: 3 windows of 32
    good = parse_params(micro_raw(max_steps=12, ckpt_every=4))
    bad = parse_params(micro_raw(max_steps=12, ckpt_every=4, seq_len=128))  # longer than the whole val shard
    cell, out = Cell("standard", "a", "base", 0), tmp_path / "cell"
    with pytest.raises(RuntimeError, match="killed"):
        _stage_fit(good, cell, out, shards, [FailAt(8, RuntimeError("killed"))])
    run_json = (out / "ckpt/run.json").read_bytes()
    with pytest.raises(DataError, match="seq_len 128"):
        fit(bad, cell, out, shards)
    assert (out / "ckpt/run.json").read_bytes() == run_json and not list((out / "ckpt").glob("stale-*"))
    first = FirstStep()
    run_id, _ = _stage_fit(good, cell, out, shards, [first])
    assert first.step == 8 and run_id == json.loads(run_json)["run_id"]


def test_resume_finds_its_checkpoint_among_the_stale_ones(tmp_path):
    shards = make_shards(tmp_path / "tokens", n_train=20_000, n_val=1000)
    a, b = parse_params(micro_raw(max_steps=12, ckpt_every=4)), parse_params(micro_raw(max_steps=4, grad_clip=0.5))
    cell, out = Cell("standard", "a", "base", 0), tmp_path / "cell"
    with pytest.raises(RuntimeError, match="killed"):
        _stage_fit(a, cell, out, shards, [FailAt(8, RuntimeError("killed"))])
    killed_id = json.loads((out / "ckpt/run.json").read_text())["run_id"]
    _stage_fit(b, cell, out, shards)  # other params: a's checkpoint moves aside
    assert (out / "ckpt" / f"stale-{config_hash(a, cell, shards)}" / "last.ckpt").is_file()
    first = FirstStep()
    run_id, resumed = _stage_fit(a, cell, out, shards, [first])
    assert first.step == 8 and run_id == killed_id and resumed["steps"] == 12
    assert (out / "ckpt" / f"stale-{config_hash(b, cell, shards)}" / "last.ckpt").is_file()
    assert not (out / "ckpt" / f"stale-{config_hash(a, cell, shards)}").exists()


# ---------------------------------------------------------------- 4. no duplicate metric steps after a resume
def test_resume_relogs_nothing_already_logged(tmp_path):
    shards = make_shards(tmp_path / "tokens", n_train=20_000, n_val=1000)
    params = parse_params(micro_raw(max_steps=12, val_every=4, ckpt_every=6, gamma_every=4))
    cell, out = Cell("unified", "a", "base", 0), tmp_path / "cell"
    with pytest.raises(RuntimeError, match="killed"):
        _stage_fit(params, cell, out, shards, [FailAt(8, RuntimeError("killed"))])  # logged 1..8, checkpoint at 6
    run_id, _ = _stage_fit(params, cell, out, shards)
    client = MlflowClient(tracking.tracking_uri())
    keys = client.get_run(run_id).data.metrics
    pairs = [(k, m.step) for k in keys for m in client.get_metric_history(run_id, k)]
    duplicates = {p for p in pairs if pairs.count(p) > 1}
    assert not duplicates, sorted(duplicates)[:10]
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/loss")) == list(range(1, 13))
    assert sorted(m.step for m in client.get_metric_history(run_id, "val/loss")) == [4, 8, 12]


# ---------------------------------------------------------------- 5. runs left RUNNING are closed on next contact
def _status(run_id):
    return MlflowClient(tracking.tracking_uri()).get_run(run_id).info.status


VICTIM = """
import sys, time
from scalelab import tracking
with tracking.stage_run("victim", params={}, experiment=sys.argv[1]) as run:
    print(run.run_id, run.parent_id, flush=True)
    time.sleep(600)
"""


def test_a_killed_stage_run_and_its_parent_are_closed_killed(project):
    root, exp = project
    proc = subprocess.Popen([sys.executable, "-c", VICTIM, exp], stdout=subprocess.PIPE, text=True, cwd=root,
                            env=dict(os.environ))
    run_id, parent_id = proc.stdout.readline().split()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _status(run_id) == _status(parent_id) == "RUNNING"
    with tracking.stage_run("next", params={}, experiment=exp) as nxt:  # the next contact
        assert _status(run_id) == _status(parent_id) == "KILLED"
    assert _status(nxt.run_id) == "FINISHED" and nxt.parent_id != parent_id


@pytest.mark.parametrize("fails", [False, True])
def test_runs_that_ended_during_an_outage_get_their_status_later(project, fails):
    root, exp = project

    def down(*args, **kwargs):
        raise ConnectionError("server gone")

    with pytest.warns(RuntimeWarning, match="server gone"):
        with pytest.raises(ValueError) if fails else contextlib.nullcontext():
            with tracking.stage_run("outage", params={}, experiment=exp) as r:
                r._client.set_terminated = down  # the server goes away before the run ends
                if fails:
                    raise ValueError("stage failed")
    assert _status(r.run_id) == _status(r.parent_id) == "RUNNING"
    assert tracking.parent_run_id(exp) is not None or fails  # next contact
    expected = "FAILED" if fails else "FINISHED"
    assert _status(r.run_id) == _status(r.parent_id) == expected


def test_a_live_concurrent_run_is_left_running(project):
    root, exp = project
    with tracking.stage_run("a", params={}, experiment=exp) as a:
        with tracking.stage_run("b", params={}, experiment=exp):
            assert _status(a.run_id) == "RUNNING"  # same host, live process: not an orphan


# ---------------------------------------------------------------- 6. invalid UTF-8 is reported, or refused
def test_invalid_utf8_is_counted_per_file_in_bytes(tmp_path, capsys):
    from scalelab.data import prepare_corpus

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "latin1.txt").write_bytes("### SCENE\nCaf\u00e9 cr\u00e8me, na\u00efve.\n".encode("latin-1"))
    (corpus / "cut.txt").write_bytes(b"### SCENE\na cut euro sign \xe2\x82 here\n")  # 2 bytes, one U+FFFD
    (corpus / "ok.txt").write_text(_scenes(0, 30))
    cfg = PrepareConfig(corpus=CorpusConfig(source="local", path=str(corpus)), val_fraction=0.3)
    stats = prepare_corpus(cfg, tmp_path / "out")
    assert stats["replaced_invalid_bytes"] == 5
    assert stats["invalid_utf8_files"] == {str(corpus / "cut.txt"): 2, str(corpus / "latin1.txt"): 3}
    err = capsys.readouterr().err
    assert "latin1.txt" in err and "3 bytes" in err
    with pytest.raises(DataError, match=r"cut\.txt: invalid UTF-8 at byte 26 .*prepare\.errors"):
        prepare_corpus(cfg.model_copy(update={"errors": "strict"}), tmp_path / "strict")
    with pytest.raises(ParamsError, match=r"prepare\.errors"):
        parse_params({**yamlio.safe_load(MICRO.read_text()), "prepare": {"errors": "ignore"}})


# ---------------------------------------------------------------- 8. names that reach a command line
@pytest.mark.parametrize("where", ["sizes", "variants"])
def test_names_are_restricted(where):
    raw = yamlio.safe_load(MICRO.read_text())
    key = "b;rm -rf ~"
    raw["model"][where][key] = raw["model"][where]["a" if where == "sizes" else "standard"]
    with pytest.raises(ParamsError, match=re.escape(f"model.{where}.{key}")):
        parse_params(raw)
    raw = yamlio.safe_load(MICRO.read_text())
    raw["pretrain"]["grid"]["recipes"] = ["muon`id`"]
    with pytest.raises(ParamsError, match=r"pretrain\.grid\.recipes\.0"):
        parse_params(raw)


# ---------------------------------------------------------------- 9. bounded memory on real corpora
def _corpus(mb: float, shape: str) -> str:
    """~mb MB of words: a scene heading every ~2 kB ("documents"), or one line without any ("one line")."""
    rng = np.random.default_rng(0)
    text = " ".join(WORDS[rng.integers(0, len(WORDS), size=int(mb * 2**20 / 5.9))])
    return re.sub(r"((?:\S+ ){300})", r"\1\n### SCENE\n", text) if shape == "documents" else text


WORDS = np.array([f"w{i}" for i in range(3000)])


def _data_ws(root: Path, mb: float, shape: str) -> tuple[Path, dict]:
    """A project folder with a local corpus (the text plus 40 short scenes, so both splits have documents), a
    tokenizer.json as if the tokenizer stage had run, and the micro params."""
    ws = root / f"{shape.replace(' ', '_')}-{mb}"
    (ws / "corpus").mkdir(parents=True)
    (ws / "corpus" / "text.txt").write_text(_corpus(mb, shape))
    (ws / "corpus" / "scenes.txt").write_text("".join(f"### SCENE {i}\n" + " ".join(WORDS[i : i + 50]) + "\n"
                                                      for i in range(40)))
    (ws / "data" / "tokenizer").mkdir(parents=True)
    (ws / "data" / "tokenizer" / "tokenizer.json").write_text(_tokenizer_json())
    params = yamlio.safe_load(MICRO.read_text())
    params["prepare"]["corpus"] = {"source": "local", "path": "corpus", "doc_split_regex": "^#+ SCENE"}
    params["tokenize"]["batch_size"] = 256
    (ws / "params.yaml").write_text(yaml.safe_dump(params))
    return ws, {**os.environ, "SCALELAB_ROOT": str(ws), "MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}


_TOK: list[str] = []


def _tokenizer_json() -> str:
    from scalelab.data.tokenizer import train_bpe

    if not _TOK:
        _TOK.append(train_bpe([_corpus(0.2, "documents")], vocab_size=400, min_frequency=2,
                              eot_token="<|endoftext|>").to_str())
    return _TOK[0]


HWM = """import atexit, runpy, sys
stage, out = sys.argv[1:]
def record():
    with open("/proc/self/status") as f:
        open(out, "w").write(next(line.split()[1] for line in f if line.startswith("VmHWM")))
atexit.register(record)
sys.argv = [stage]
runpy.run_path(stage, run_name="__main__")
"""


def _peak_rss_mb(stage: str, ws: Path, env: dict) -> float:
    """Peak RSS of one stage process in MB: its own mm's high-water mark (VmHWM), read at exit. (getrusage's maxrss
    of a child includes the parent's memory it was forked from.)"""
    res = subprocess.run([sys.executable, "-c", HWM, str(ROOT / "stages" / f"{stage}.py"), str(ws.resolve() / "hwm")], cwd=ws,
                         env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    return int((ws / "hwm").read_text()) / 1024


def _marginal_rss(tmp_path, shape: str, stages: tuple[str, ...], sizes=(2, 8)) -> dict[str, float]:
    """MB of peak RSS per MB of corpus, between two corpus sizes: ~0 when a stage streams, >= 1 when it holds the
    corpus (a difference of two runs, so the interpreter's and libraries' own memory cancels)."""
    peaks = {stage: [] for stage in stages}
    for mb in sizes:
        ws, env = _data_ws(tmp_path, mb, shape)
        for stage in stages:
            peaks[stage].append(_peak_rss_mb(stage, ws, env))
    return {stage: (hi - lo) / (sizes[1] - sizes[0]) for stage, (lo, hi) in peaks.items()}


pytestmark_linux = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")


@pytest.mark.slow
@pytestmark_linux
def test_prepare_streams_a_corpus_of_many_documents(tmp_path):
    """Was ~5 MB of RSS per MB of corpus (polars frames and lists of the whole corpus); now flat."""
    ratio = _marginal_rss(tmp_path, "documents", ("prepare",))["prepare"]
    assert ratio < 1.0, ratio


@pytest.mark.slow
@pytestmark_linux
def test_one_huge_line_costs_a_few_times_its_size_not_a_hundred(tmp_path):
    """One 8 MB document: held whole by necessity, but encoded piece by piece (was ~145 MB per MB in tokenize:
    the tokenizer's encoding of the whole document at once) and written without copies beyond its text and bytes."""
    ratios = _marginal_rss(tmp_path, "one line", ("prepare", "tokenize_shards"))
    assert max(ratios.values()) < 5.0, ratios


@pytest.mark.slow
def test_tokenize_streams_the_prepared_splits(tmp_path, monkeypatch):
    """The tokenize stage's Python heap stays at a few row groups, not the corpus (it held both splits as lists)."""
    import runpy
    import tracemalloc

    ws, env = _data_ws(tmp_path, 6, "documents")
    _peak_rss_mb("prepare", ws, env)
    monkeypatch.chdir(ws)
    monkeypatch.setenv("SCALELAB_ROOT", str(ws))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setattr(sys, "argv", ["tokenize_shards.py"])
    # What the stage imports is heap too, not the corpus's: imported before tracing starts
    import mlflow  # noqa: F401
    import scalelab.data  # noqa: F401
    import scalelab.pipeline.stage  # noqa: F401
    import scalelab.tracking  # noqa: F401
    tracemalloc.start()
    try:
        with pytest.raises(SystemExit) as done, pytest.warns(RuntimeWarning, match="unavailable"):
            runpy.run_path(str(ROOT / "stages" / "tokenize_shards.py"), run_name="__main__")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert done.value.code == 0
    corpus = (ws / "corpus" / "text.txt").stat().st_size
    # Streaming holds a few row groups of BATCH_CHARS (3.05 MB measured at 1 MiB groups), the corpus as lists would
    # be all 6 MB and more: a bound in row groups, not a fraction of the corpus, whatever the corpus size
    from scalelab.data.corpus import BATCH_CHARS

    assert peak < 4 * BATCH_CHARS < corpus, (peak, BATCH_CHARS, corpus)


# ---------------------------------------------------------------- 10. stale checkpoints: the newest few
def test_reruns_keep_the_newest_stale_checkpoints_and_every_resumable_one(tmp_path, capsys):
    shards = make_shards(tmp_path / "tokens", n_train=20_000, n_val=1000)
    cell, out = Cell("standard", "a", "base", 0), tmp_path / "cell"
    quick = dict(max_steps=2, ckpt_every=2, val_every=2, sharpness={"enabled": False}, keep_stale=2)
    interrupted = parse_params(micro_raw(**{**quick, "max_steps": 8}))
    with pytest.raises(RuntimeError, match="killed"):
        fit(interrupted, cell, out, shards, callbacks=[FailAt(2, RuntimeError("killed"))])
    done = parse_params(micro_raw(**quick))
    for run in range(5):  # a completed cell rerun: each run moves the previous checkpoint aside
        fit(done, cell, out, shards)
        # which run a checkpoint is from: a mark that moves aside with it (names are reused once pruned)
        (out / "ckpt" / "which-run").write_text(str(run))
        time.sleep(0.01)
    stale = {p.name: p for p in (out / "ckpt").glob("stale-*")}
    done_hash, int_hash = config_hash(done, cell, shards), config_hash(interrupted, cell, shards)
    assert (out / "ckpt" / "which-run").read_text() == "4"  # the current checkpoint: the last run's
    assert (stale[f"stale-{int_hash}"] / "last.ckpt").is_file()  # resumable: never deleted
    kept = {(p / "which-run").read_text() for name, p in stale.items() if name.startswith(f"stale-{done_hash}")}
    assert kept == {"2", "3"}, stale  # keep_stale 2: the newest two completed runs moved aside, by time
    assert re.search(r"removed \d+ stale checkpoints? .*freed [\d.]+ MB", capsys.readouterr().err)


@mutant("prune-keeps-oldest")
def _(monkeypatch):  # the stale folders oldest first: the prune keeps the oldest `keep`
    from scalelab.train import resume

    real = resume._stale
    monkeypatch.setattr(resume, "_stale", lambda ckpt_dir: real(ckpt_dir)[::-1])


@pytest.mark.mutation
def test_the_prune_test_catches_keeping_the_oldest():
    assert_caught("tests/test_hardening.py::test_reruns_keep_the_newest_stale_checkpoints_and_every_resumable_one",
                  "prune-keeps-oldest")


def test_keep_stale_does_not_change_the_config_hash(tmp_path):
    shards = make_shards(tmp_path / "tokens", n_train=2000, n_val=200)
    cell = Cell("standard", "a", "base", 0)
    assert config_hash(parse_params(micro_raw(keep_stale=0)), cell, shards) == \
        config_hash(parse_params(micro_raw(keep_stale=5)), cell, shards)


# ---------------------------------------------------------------- 11. the README offers what the schema accepts
def test_the_docs_strategies_match_the_schema():
    """docs/scale.md names exactly the strategies the schema accepts, and says FSDP is not offered."""
    doc = " ".join((ROOT / "docs" / "scale.md").read_text().split())
    sentence = doc.split("`pretrain.strategy` is", 1)[1].split(". ", 1)[0]
    offered = set(re.findall(r"`(\w+)`", sentence))
    assert offered == set(get_args(PretrainConfig.model_fields["strategy"].annotation))
    claims = re.findall(r"[^.]*\bfsdp\b[^.]*\.", doc, re.IGNORECASE)
    assert claims and all(re.search(r"not|unsupported|rejects", c) for c in claims), claims
    assert "docs/reliability.md" in (ROOT / "README.md").read_text()


# ---------------------------------------------------------------- 12. no test leaves a process behind
def _detached_sleep(tmp_path) -> int:
    """A `sleep` whose parent shell has exited (reparented: no longer a descendant of this process); its pid."""
    pidfile = tmp_path / "sleep.pid"
    subprocess.run(["sh", "-c", f"sleep 300 >/dev/null 2>&1 & echo $! > {pidfile}"], check=True, timeout=30)
    return int(pidfile.read_text())


def test_the_leak_check_finds_a_reparented_process_by_its_mark_and_kills_it(tmp_path):
    import conftest

    pid = _detached_sleep(tmp_path)
    try:
        assert Path(f"/proc/{pid}").exists() and os.getppid() != pid
        deadline = time.monotonic() + 10  # its environ reads empty until its exec is done (CI run 3)
        while pid not in conftest.marked_processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid in conftest.marked_processes() and "sleep 300" in conftest.marked_processes()[pid]
        assert os.getpid() not in conftest.marked_processes()  # the test process itself is not a leftover
        left = conftest.kill_leftovers(grace=0.5)
        assert pid in left and not conftest._alive(pid)
        assert pid not in conftest.marked_processes()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@mutant("leak-scan-descendants-only")
def _(monkeypatch):  # the naive scan: this process's descendants, which a reparented orphan no longer is
    import conftest
    import psutil

    monkeypatch.setattr(conftest, "marked_processes", lambda mark=None: {
        c.pid: " ".join(c.cmdline()) for c in psutil.Process().children(recursive=True) if c.is_running()})


@mutant("leak-not-killed")
def _(monkeypatch):  # offenders listed but left running
    import conftest

    monkeypatch.setattr(conftest, "kill_leftovers", lambda grace=0: conftest.marked_processes())


@pytest.mark.mutation
@pytest.mark.parametrize("name", ["leak-scan-descendants-only", "leak-not-killed"])
def test_the_leak_check_test_catches(name):
    assert_caught("tests/test_hardening.py::test_the_leak_check_finds_a_reparented_process_by_its_mark_and_kills_it",
                  name)


def test_the_suite_hands_out_its_longest_files_first(request):
    """The suite's scheduling (tests/conftest.py): every file named longest-first exists, and xdist keeps that order
    (its default reorders by number of tests, which sent the few-test, longest files last: one ran alone ~2 min)."""
    import conftest

    assert [name for name in conftest.LONGEST_FIRST if not (ROOT / "tests" / name).is_file()] == []
    if hasattr(request.config, "workerinput"):  # an xdist worker: its options are the controller's
        assert request.config.getoption("loadscopereorder") is False


def test_the_leak_check_spares_only_this_processs_resource_tracker():
    """multiprocessing's resource tracker lives as long as the test process (its pipe closes when the process
    exits): not a leftover. Anything else the process started, a `sleep` say, is."""
    import subprocess as sp
    from multiprocessing import resource_tracker

    import conftest

    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid
    other = sp.Popen([sys.executable, "-c", "from multiprocessing.resource_tracker import main; import time; "
                      "time.sleep(60)"])  # looks like a tracker, but is not this interpreter's
    sleeper = sp.Popen(["sleep", "60"])
    try:
        # A child is visible by its environment only once its exec has set up the new stack, which can lag Popen's
        # return (CI run 6 read `sleep`'s environ empty): wait for both, then check the tracker is spared.
        deadline = time.monotonic() + 10
        while not {sleeper.pid, other.pid} <= (found := conftest.marked_processes()).keys() \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tracker not in found and sleeper.pid in found and other.pid in found
    finally:
        for p in (other, sleeper):
            p.kill()
            p.wait()


def test_a_session_that_leaves_a_process_behind_fails(tmp_path):
    """The suite's own conftest in a pytest run whose test leaves a `sleep` behind: the run fails naming its pid and
    command line, and the sleep is killed; one that exits within the grace period is no leftover."""
    (tmp_path / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tmp_path / "test_leak.py").write_text(
        "import subprocess\n"
        "from pathlib import Path\n\n"
        "def test_exits_soon():\n"
        "    subprocess.Popen(['sleep', '0.3'])\n\n"
        "def test_leaves_a_sleep():\n"
        "    p = subprocess.Popen(['sleep', '301'], start_new_session=True)\n"
        "    Path('leaked.pid').write_text(str(p.pid))\n")
    env = {k: v for k, v in os.environ.items() if k != "SCALELAB_MUTANT"} | {"SCALELAB_LEAK_GRACE_S": "1"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-p", "no:randomly", "test_leak.py"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    pid = int((tmp_path / "leaked.pid").read_text())
    try:
        out = res.stdout + res.stderr
        assert res.returncode == 1 and "2 passed, 1 error" in out, out[-3000:]
        assert "1 process(es) started by the tests still alive" in out and f"pid {pid}: sleep 301" in out, out[-3000:]
        assert "sleep 0.3" not in out
        time.sleep(0.2)
        from conftest import _alive

        assert not _alive(pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- 13. progress with an ETA on every long loop
class _Clock:
    def __init__(self, dt: float):
        self.t, self.dt = 0.0, dt

    def __call__(self) -> float:
        return self.t

    def tick(self) -> None:
        self.t += self.dt


class _Terminal:
    """A stream that says it is a terminal (what a user's shell gives a stage)."""

    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return True


def _lines(records) -> list[str]:
    return [r.getMessage() for r in records if r.name == "scalelab.progress"]


def test_progress_off_a_terminal_is_a_line_at_each_step_with_its_eta(caplog):
    """100 units, 1 s each, a line per 10%: at 10, 20, ..., 100 done, each with elapsed/done × left as its ETA, the
    last with the total time; nothing on the stream (no bar when it is not a terminal)."""
    import io

    from scalelab.runtime.log import Progress

    clock, stream = _Clock(1.0), io.StringIO()
    with caplog.at_level("INFO", logger="scalelab.progress"):
        with Progress(100, "perplexity", "batches", step=0.1, min_interval=0, stream=stream, clock=clock) as bar:
            for _ in range(100):
                clock.tick()
                bar.update()
    lines = _lines(caplog.records)
    assert [int(re.search(r"\((\d+)/100", line).group(1)) for line in lines] == list(range(10, 101, 10)), lines
    assert lines[0] == "perplexity: 10% (10/100 batches), 10s elapsed, ETA 1m30s"
    assert lines[4] == "perplexity: 50% (50/100 batches), 50s elapsed, ETA 50s"
    assert all("ETA" in line for line in lines[:-1]) and lines[-1] == "perplexity: 100% (100/100 batches) in 1m40s"
    assert stream.getvalue() == ""


def test_progress_lines_are_rate_limited_and_a_slow_step_still_reports(caplog):
    """Fast units: one line per min_interval at most, however many steps pass; a loop done within it logs nothing.
    A slow first step: a line after max_interval anyway."""
    from scalelab.runtime.log import Progress, progress

    clock = _Clock(0.125)
    with caplog.at_level("INFO", logger="scalelab.progress"):
        with Progress(1000, "tokenize", step=0.01, min_interval=5, max_interval=60, stream=None, clock=clock) as bar:
            times = []
            for _ in range(1000):
                clock.tick()
                before = len(_lines(caplog.records))
                bar.update()
                if len(_lines(caplog.records)) > before:
                    times.append(clock.t)
    assert len(times) == 25 and all(b - a >= 5 for a, b in zip(times, times[1:])), times  # 125 s: one each 5 s
    assert _lines(caplog.records)[-1] == "tokenize: 100% (1000/1000 it) in 2m05s"
    caplog.clear()
    with caplog.at_level("INFO", logger="scalelab.progress"):
        assert list(progress(range(50), "short", min_interval=5, clock=_Clock(0.01), stream=None)) == list(range(50))
        assert _lines(caplog.records) == []
        slow = _Clock(61.0)
        with Progress(100, "slow", step=0.5, min_interval=5, max_interval=60, clock=slow) as bar:
            slow.tick()
            bar.update()  # 1%: no step passed, but a minute went by
        assert _lines(caplog.records) == ["slow: 1% (1/100 it), 1m01s elapsed, ETA 1h40m"]


def test_progress_on_a_terminal_is_a_bar_not_log_lines(caplog):
    from scalelab.runtime.log import progress

    term = _Terminal()
    with caplog.at_level("INFO", logger="scalelab.progress"):
        assert sum(progress(range(30), "calibration", unit="blocks", stream=term, min_interval=0)) == sum(range(30))
    assert _lines(caplog.records) == []
    assert "calibration" in term.text and "30/30" in term.text and "\r" in term.text, term.text


@mutant("progress-without-eta")
def _(monkeypatch):
    from scalelab.runtime import log

    line = log.Progress.line
    monkeypatch.setattr(log.Progress, "line", lambda self, now=None: line(self, now).split(", ETA")[0])


@mutant("progress-bar-off-a-terminal")
def _(monkeypatch):
    from scalelab.runtime import log

    monkeypatch.setattr(log, "_isatty", lambda stream: True)


@mutant("progress-lines-every-update")
def _(monkeypatch):
    from scalelab.runtime import log

    monkeypatch.setattr(log, "PROGRESS_STEP", 0.0)
    init = log.Progress.__init__
    monkeypatch.setattr(log.Progress, "__init__",
                        lambda self, *a, **k: (init(self, *a, **k), setattr(self, "min_interval", 0.0))[0])


test_the_progress_tests_are_caught = mutation_checks([
    ("progress-without-eta", "tests/test_hardening.py::test_progress_off_a_terminal_is_a_line_at_each_step_with_its_eta"),
    ("progress-bar-off-a-terminal",
     "tests/test_hardening.py::test_progress_off_a_terminal_is_a_line_at_each_step_with_its_eta"),
    ("progress-lines-every-update",
     "tests/test_hardening.py::test_progress_lines_are_rate_limited_and_a_slow_step_still_reports"),
])
