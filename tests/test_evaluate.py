"""Evaluation: perplexity on the training-time validation windows, the offline zero-shot tasks, lm-eval's skip, and
the stage with its MLflow links (tiny random models made here, never downloaded)."""

import json
import math
import os
import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
import yaml
from conftest import MICRO, ROOT
from evaldata import make_cell, make_data
from mutants import assert_caught, mutant, mutation_checks

from scalelab.evaluate import lmeval, zeroshot
from scalelab.evaluate.lm import EvalLM, load_lm
from scalelab.evaluate.perplexity import perplexity, throughput, val_windows
from scalelab.runtime import yamlio


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalproj")
    val = make_data(root)
    model = make_cell(root, "standard-a-base-0")
    return root, val, model


class CharTokenizer:
    """One token per character: bytes per token is 1 on ASCII text."""

    eos_token_id = None

    def __init__(self, text: str):
        self.vocab = {c: i for i, c in enumerate(sorted(set(text)))}
        self.inv = {i: c for c, i in self.vocab.items()}

    def encode(self, text, add_special_tokens=False):
        return [self.vocab[c] for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.inv[int(i)] for i in ids)

    def get_vocab(self):
        return dict(self.vocab)


def char_lm(text: str, forward=None, max_len: int = 4096) -> EvalLM:
    tok = CharTokenizer(text)
    v = len(tok.vocab)
    forward = forward or (lambda ids: torch.zeros(*ids.shape, v))  # uniform
    return EvalLM("char", "-", "test", forward, tok, max_len, 0, torch.device("cpu"), torch.nn.Linear(1, 1))


def ngram_lm(text: str, order: int = 12) -> EvalLM:
    """A model that has memorised `text`: longest-match back-off over n-gram counts (the oracle of the tasks)."""
    tok = CharTokenizer(text)
    ids = tok.encode(text)
    counts = defaultdict(Counter)
    for i in range(1, len(ids)):
        for k in range(1, order + 1):
            if i - k < 0:
                break
            counts[tuple(ids[i - k:i])][ids[i]] += 1
    v = len(tok.vocab)

    def forward(batch):
        out = torch.full((*batch.shape, v), -20.0)
        for b, row in enumerate(batch.tolist()):
            for t in range(len(row)):
                for k in range(min(order, t + 1), 0, -1):
                    if (c := counts.get(tuple(row[t - k + 1:t + 1]))) is not None:
                        for nxt, n in c.items():
                            out[b, t, nxt] = math.log(n)
                        break
        return out

    return EvalLM("ngram", "-", "test", forward, tok, 4096, 0, torch.device("cpu"), torch.nn.Linear(1, 1))


def test_hf_export_scores_exactly_the_training_validation_windows(project, tmp_path):
    root, val, model = project
    lm = load_lm(root / "data/pretrain/standard-a-base-0/model/hf", "standard-a")
    batches, source = val_windows(lm, shards_dir=root / "data/tokens", val_text=val,
                                  tokenizer_json=root / "data/tokenizer/tokenizer.json", seq_len=32, val_tokens=1024,
                                  batch_size=6)
    assert source == "shards" and lm.kind == "hf:qwen3"
    r = perplexity(lm, batches)
    with torch.no_grad():  # what the pretrain stage's validation computes: scalelab's model, token-weighted CE
        nats = sum(float(model(x, y).loss) * y.numel() for x, y in batches)
    assert r["val_tokens"] == 1024 == sum(y.numel() for _, y in batches)
    assert r["val_loss"] == pytest.approx(nats / 1024, rel=1e-5)
    assert r["ppl"] == pytest.approx(math.exp(r["val_loss"]))
    # bits per byte = Σ CE / (ln 2 · Σ UTF-8 bytes of the scored tokens). The bytes counted here without decoding:
    # a byte-level BPE token's vocabulary string has one character per byte; the end-of-text token has none.
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(root / "data/tokenizer/tokenizer.json"))
    special = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    n_bytes = sum(len(piece) for _, y in batches for i in y.flatten().tolist()
                  if (piece := tok.id_to_token(i)) not in special)
    assert r["bpb"] == pytest.approx(r["val_loss"] * r["val_tokens"] / (math.log(2) * n_bytes), rel=1e-9)
    # scalelab's own format (MoE, Peri-LN exports) loads through the same interface and scores the same
    from scalelab.model import save_model

    own = tmp_path / "own"
    save_model(model, own)
    lm.tokenizer.save_pretrained(own)
    assert load_lm(own, "own").kind == "scalelab"
    assert perplexity(load_lm(own, "own"), batches)["val_loss"] == pytest.approx(r["val_loss"], rel=1e-5)
    speed = throughput(lm, batches, repeats=2)
    assert speed["tokens_per_s"] > 0 and speed["peak_mem_mb"] > 0
    # the throughput of an evaluation is read off its perplexity pass: batches shaped like the first, after the first
    times, calls = [], []
    perplexity(lm, batches, times)
    forward = lm.forward
    lm.forward = lambda ids: (calls.append(ids.shape), forward(ids))[1]
    full = [t for t, (x, _) in zip(times, batches) if x.shape == batches[0][0].shape]
    assert len(times) == len(batches) and len(full) == 5 < len(batches)  # 32 windows by 6: a last batch of 2
    assert throughput(lm, batches, 3, times)["tokens_per_s"] == 6 * 32 / float(np.median(full[1:4])) and not calls
    throughput(lm, batches, 6, times)  # 4 timed passes there: 2 more over the first batch, no warm-up
    assert calls == [batches[0][0].shape] * 2


def test_another_tokenizer_is_scored_on_the_same_text_retokenized():
    docs = ["To be, or not to be, that is the question.\n" * 20, "Whether 'tis nobler in the mind to suffer.\n" * 20]
    lm = char_lm("".join(docs))
    batches, source = val_windows(lm, shards_dir="-", val_text=docs, tokenizer_json=_project_tokenizer(),
                                  seq_len=16, val_tokens=400, batch_size=8)
    assert source == "retokenized"
    assert sum(y.numel() for _, y in batches) == 400 // 16 * 16
    r = perplexity(lm, batches)  # uniform over V characters, one byte each
    v = len(lm.tokenizer.vocab)
    assert r["val_loss"] == pytest.approx(math.log(v)) and r["bpb"] == pytest.approx(math.log2(v))


def test_bits_per_byte_count_utf8_bytes_not_characters():
    """Every character of this text is 2 UTF-8 bytes (Greek letters, '·' for spaces): a uniform model over its V
    characters scores log2(V) bits per character, so exactly log2(V)/2 bits per byte."""
    docs = ["αρχή·ήμισυ·παντός·" * 30, "γνώθι·σαυτόν·μηδέν·άγαν·" * 30]
    assert all(len(c.encode()) == 2 for c in "".join(docs))
    lm = char_lm("".join(docs))
    batches, _ = val_windows(lm, shards_dir="-", val_text=docs, tokenizer_json=_project_tokenizer(),
                             seq_len=16, val_tokens=400, batch_size=8)
    v = len(lm.tokenizer.vocab)
    assert perplexity(lm, batches)["bpb"] == pytest.approx(math.log2(v) / 2, rel=1e-6)  # float32 CE


@mutant("bpb-chars")
def _(monkeypatch):  # bits per character: the denominator counts decoded characters, not their UTF-8 bytes
    real = perplexity

    def chars(lm, batches):
        r = real(lm, batches)
        n_chars = sum(len(lm.tokenizer.decode(row, skip_special_tokens=True)) for _, y in batches for row in y.tolist())
        return {**r, "bpb": r["val_loss"] * r["val_tokens"] / (math.log(2) * n_chars)}
    monkeypatch.setattr(sys.modules[__name__], "perplexity", chars)


@mutant("bpb-nats")
def _(monkeypatch):  # nats per byte: ln where log2 is due
    real = perplexity
    monkeypatch.setattr(sys.modules[__name__], "perplexity",
                        lambda lm, batches: (r := real(lm, batches)) | {"bpb": r["bpb"] * math.log(2)})


@pytest.mark.mutation
@pytest.mark.parametrize("name, test", [
    ("bpb-chars", "test_bits_per_byte_count_utf8_bytes_not_characters"),
    ("bpb-nats", "test_bits_per_byte_count_utf8_bytes_not_characters"),
    ("bpb-nats", "test_hf_export_scores_exactly_the_training_validation_windows")])
def test_the_bits_per_byte_tests_catch(name, test):
    assert_caught(f"tests/test_evaluate.py::{test}", name)


def _project_tokenizer():
    """Any tokenizer.json whose vocabulary differs from the character model's."""
    from tokenizers import Tokenizer, models

    path = ROOT / ".pytest_cache" / "tok-other.json"
    path.parent.mkdir(exist_ok=True)
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(path))
    return path


def test_items_are_deterministic_true_lines_with_distractors_from_the_split(project):
    _, val, _ = project
    a = zeroshot.continuation_items(val, 40, 4, 200, seed=3)
    assert a == zeroshot.continuation_items(val, 40, 4, 200, seed=3)
    assert a != zeroshot.continuation_items(val, 40, 4, 200, seed=4)
    lines = {val[d][s:e] for d, s, e in zeroshot.spoken_lines(val)}
    for it in a:
        truth = it.choices[it.answer]
        assert any(it.context + truth in doc for doc in val)  # the true continuation follows its context
        assert it.context.endswith("\n") and len(set(it.choices)) == 4 and set(it.choices) <= lines
    assert Counter(it.answer for it in a).keys() == {0, 1, 2, 3}  # the answer's position is shuffled
    cloze = zeroshot.cloze_items(val, 40, 4, 200, seed=3)
    for it in cloze:
        truth = it.choices[it.answer]
        assert any(it.context + truth in doc for doc in val)
        for ch in it.choices:  # the candidates differ from the true line in one word only
            if ch != truth:
                pre = len(os.path.commonprefix([ch, truth]))
                suf = len(os.path.commonprefix([ch[::-1], truth[::-1]]))
                assert zeroshot.WORD.fullmatch(truth[pre:len(truth) - suf] or "xxxx") or pre + suf >= len(truth) - 4


def test_scores_length_normalisation_and_an_oracle_far_above_chance(project):
    _, val, _ = project
    text = "".join(val)
    items = zeroshot.continuation_items(val, 30, 4, 150, seed=0)
    uniform = char_lm(text)
    scores = zeroshot.choice_scores(uniform, items)
    v = len(uniform.tokenizer.vocab)
    for it, s in zip(items, scores):  # Σ log p = -len·log V under a uniform model; bytes = characters (ASCII)
        for ch, (logp, n_bytes) in zip(it.choices, s):
            assert logp == pytest.approx(-len(ch) * math.log(v), rel=1e-5) and n_bytes == len(ch.encode())
        per_byte = [logp / n for logp, n in s]  # per byte, length no longer decides: every candidate ties
        assert max(per_byte) - min(per_byte) < 1e-5
    # unnormalised, the shortest candidate wins
    shortest = [int(np.argmin([len(c) for c in it.choices])) == it.answer for it in items]
    assert zeroshot.accuracy(items, scores, normalize=False)["acc"] == pytest.approx(np.mean(shortest))
    oracle = zeroshot.run_tasks(ngram_lm(text), val, items=30, choices=4, context_chars=150, seed=0)
    assert oracle["continuation"]["chance"] == 0.25
    assert oracle["continuation"]["acc"] >= 0.9 and oracle["cloze"]["acc"] >= 0.8


def test_lm_eval_skips_with_a_reason(monkeypatch):
    assert "no tasks" in lmeval.run("m", "hf:qwen3", [], limit=None, device="cpu", dtype="float32",
                                    batch_size=1)["skipped"]
    monkeypatch.setattr(lmeval.importlib.util, "find_spec", lambda name: None)
    assert "not installed" in lmeval.run("m", "hf:qwen3", ["hellaswag"], limit=2, device="cpu", dtype="float32",
                                         batch_size=1)["skipped"]
    # installed, but offline without the task data: the harness raises, the evaluation goes on
    fake = type(sys)("lm_eval")

    def offline(**kwargs):
        raise ConnectionError("Couldn't reach 'Rowan/hellaswag' on the Hub (LocalEntryNotFoundError)")

    fake.simple_evaluate = offline
    monkeypatch.setitem(sys.modules, "lm_eval", fake)
    monkeypatch.setattr(lmeval.importlib.util, "find_spec", lambda name: object())
    out = lmeval.run("m", "hf:qwen3", ["hellaswag"], limit=2, device="cpu", dtype="float32", batch_size=1)
    assert "offline" in out["skipped"] and "ConnectionError" in out["skipped"]
    fake.simple_evaluate = lambda **kw: {"results": {"hellaswag": {"acc,none": 0.5, "alias": "hellaswag"}}}
    assert lmeval.run("m", "hf:qwen3", ["hellaswag"], limit=2, device="cpu", dtype="float32",
                      batch_size=1) == {"results": {"hellaswag": {"acc": 0.5}}}


def _stage(root, *args):
    env = {**os.environ, "SCALELAB_ROOT": str(root)}  # the tests' MLflow store (conftest: on tmpfs)
    return subprocess.run([sys.executable, str(ROOT / "stages/evaluate.py"), *args], cwd=root, env=env,
                          capture_output=True, text=True)


def test_stage_writes_metrics_linked_to_the_model_in_mlflow(project):
    root, _, _ = project
    params = yamlio.safe_load(MICRO.read_text())
    params["evaluate"] = {**params["evaluate"], "sizes": ["a"], "zeroshot": {"items": 20, "choices": 4,
                                                                            "context_chars": 200, "seed": 0}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    bad = _stage(root, "--model", "nope")
    assert bad.returncode == 2 and "evaluate.models" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    res = _stage(root, "--variant", "standard", "--size", "a", "--seed", "0")
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads((root / "metrics/evaluate/standard-a-base-0.json").read_text())
    assert m["windows"] == "shards" and m["chance"] == 0.25 and m["zeroshot_items"] == 20
    assert m["val_loss"] > 0 and 0 <= m["continuation_acc"] <= 1 and m["tokens_per_s"] > 0
    assert "skipped" in m["lm_eval"]
    from mlflow import MlflowClient

    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = client.get_run(m["mlflow_run_id"])
    assert run.data.metrics["eval/val_loss"] == pytest.approx(m["val_loss"])
    assert [i.model_id for i in run.inputs.model_inputs] == [m["mlflow_model_id"]]
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["tokens/val"]
    model = client.get_logged_model(m["mlflow_model_id"])
    assert model.tags["scalelab.path"] == "data/pretrain/standard-a-base-0/model/hf"
    assert {x.key: x.value for x in model.metrics}["eval/val_loss"] == pytest.approx(m["val_loss"])
    exp = client.get_experiment(run.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"


def _mixed_items(val: list[str]) -> list:
    """Items of every shape the scorer meets: contexts from 1 token to beyond the model's 64 positions (cut from the
    left, scored without a shared context), 1-token and long choices, 2 to 4 choices, choices that share their first
    tokens (one branch of the tree up to where they part), and two items with one context (their choices share its
    computation)."""
    cont = zeroshot.continuation_items(val, 12, 4, 100, seed=1)
    cloze = zeroshot.cloze_items(val, 8, 3, 60, seed=2)
    by_hand = [zeroshot.Item("A", ("n", "the whole of the line", "e"), 1),
               zeroshot.Item(val[0][:40], ("b", "ca"), 0),
               zeroshot.Item(val[0][:40], ("c", "of it", "they"), 2),
               zeroshot.Item(val[0][40:90], ("to be, or not", "to be, or else", "to be", "to be, or not"), 1),
               zeroshot.Item(val[1][:600], ("to be, or not to be", "x"), 0)]  # ≫ 64 tokens: the full-sequence path
    return cont + cloze + by_hand


def test_shared_context_scores_equal_one_sequence_per_choice(project, monkeypatch):
    """Each context computed once, with its choices as a prefix tree in the same row (batched with other items'),
    scores exactly what one full sequence per (context, choice) scores, to float32 rounding; and the shared path
    really runs: one row per distinct context with a choice that fits whole, never one per choice, and a prefix
    that choices share fed once."""
    root, val, _ = project
    lm = load_lm(root / "data/pretrain/standard-a-base-0/model/hf", "standard-a")
    items = _mixed_items(val)
    rows = []
    real = lm.masked
    lm.masked = lambda ids, allowed, pos, r, c: (rows.append(allowed), real(ids, allowed, pos, r, c))[1]
    shared = zeroshot.choice_scores(lm, items, batch_size=8)
    full = zeroshot.choice_scores(lm, items, batch_size=8, shared=False)
    one = zeroshot.choice_scores(lm, items, batch_size=1, shared=False)
    for s, f, o in zip(shared, full, one):
        assert [b for _, b in s] == [b for _, b in f] == [b for _, b in o]  # bytes scored
        assert [v for v, _ in s] == pytest.approx([v for v, _ in o], abs=1e-4, rel=1e-5)
        assert [v for v, _ in f] == pytest.approx([v for v, _ in o], abs=1e-4, rel=1e-5)
    fits = defaultdict(set)  # context -> the inputs (all tokens but the last) of its choices that fit whole
    for it in items:
        c = lm.encode(it.context)
        for x in map(lm.encode, it.choices):
            if len(c) + len(x) - 1 <= lm.max_len:
                fits[it.context].add(tuple(x[:-1]))
    assert 4 <= len(fits) < len({it.context for it in items}) - 4  # both paths exercised, on several items each
    assert sum(a.shape[0] for a in rows) == len(fits)  # one row per context
    # fed once: each context and each distinct prefix of its choices' inputs (a position that attends to nothing
    # before it, but the first, is padding)
    fed = sum(a.shape[0] + int(a.tril(-1).any(dim=2).sum()) for a in rows)
    prefixes = {c: {x[:k] for x in xs for k in range(1, len(x) + 1)} for c, xs in fits.items()}
    assert fed == sum(len(lm.encode(c)) + len(p) for c, p in prefixes.items())
    shared_item = val[0][40:90]
    assert len(prefixes[shared_item]) < sum(map(len, fits[shared_item]))  # choices there do share a prefix
    # the accuracies built on the shared path are those of the reference
    assert zeroshot.accuracy(items, shared, True) == zeroshot.accuracy(items, one, True)


def _masked_with(monkeypatch, change):
    """A mutant of the model's masked forward: `change(ids, allowed, pos) -> (allowed, pos)`."""
    real = zeroshot._shared_contexts

    def mutated(lm, groups, b):
        masked = lm.masked
        lm.masked = lambda ids, allowed, pos, r, c: masked(ids, *change(ids, allowed, pos), r, c)
        try:
            return real(lm, groups, b)
        finally:
            lm.masked = masked
    monkeypatch.setattr(zeroshot, "_shared_contexts", mutated)


@mutant("zeroshot-context-shifted")
def _(monkeypatch):  # the shared context loses its first token (an off-by-one in the context rows)
    real = zeroshot._shared_contexts
    monkeypatch.setattr(zeroshot, "_shared_contexts",
                        lambda lm, groups, b: real(lm, [(c[1:] or c, xs) for c, xs in groups], b))


@mutant("zeroshot-choices-swapped")
def _(monkeypatch):  # the scores of a context's continuations come back in another order
    real = zeroshot._shared_contexts
    monkeypatch.setattr(zeroshot, "_shared_contexts", lambda lm, groups, b: [s[::-1] for s in real(lm, groups, b)])


@mutant("zeroshot-positions-by-column")
def _(monkeypatch):  # the tree's nodes positioned by their column in the row, not by their depth (RoPE)
    _masked_with(monkeypatch, lambda ids, allowed, pos: (allowed, torch.arange(ids.shape[1]).expand_as(ids)))


@mutant("zeroshot-branches-see-each-other")
def _(monkeypatch):  # a node attends to every earlier node of its row (plain causal), not only to its ancestors
    _masked_with(monkeypatch, lambda ids, allowed, pos: (
        allowed | torch.ones_like(allowed[0]).tril(), pos))


test_the_shared_context_test_catches = mutation_checks([
    (m, "tests/test_evaluate.py::test_shared_context_scores_equal_one_sequence_per_choice")
    for m in ("zeroshot-context-shifted", "zeroshot-choices-swapped", "zeroshot-positions-by-column",
              "zeroshot-branches-see-each-other")])
