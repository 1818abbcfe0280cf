"""scalelab.pipeline.dvcrun: DVC reads dvc.lock with its safe loader when updating it, and writes exactly what it wrote before."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dvc.utils.serialize import _yaml

from scalelab.pipeline import dvcrun, yamlcache

DVC_DUMP = _yaml._dump  # DVC's own dumper, as collected (before any test patches it)
DVC_FOR_UPDATE = _yaml.parse_yaml_for_update  # and its round-trip read

LOCK_DATA = {"schema": "2.0", "stages": {
    "pretrain@standard-xs-0": {
        "cmd": "python stages/pretrain.py --variant standard --size xs --recipe base --seed 0 --and a long tail",
        "deps": [{"path": "src/scalelab/model", "hash": "md5", "md5": "9fa57d7c3116a5c90fbaf4dceb823d19.dir",
                  "size": 123, "nfiles": 7}],
        "params": {"params.yaml": {"model.norm_eps": 1e-06, "pretrain.max_tokens": None, "pretrain.threads": 0,
                                   "optim.adamw": {"betas": [0.9, 0.95], "lr": 0.003, "name": "adamw"},
                                   "pretrain.sharpness": {"enabled": False, "every": None, "tol": 0.02}}},
        "outs": [{"path": "data/x", "hash": "md5", "md5": "d0cff2d8ce34ab3c4b34cce482574ca0.dir"}]}}}


def test_the_safe_read_dumps_back_the_same_bytes():
    stream = io.StringIO()
    _yaml._dump(LOCK_DATA, stream)  # how DVC writes dvc.lock
    text = stream.getvalue()
    dvcrun.patch()
    dvcrun.patch()  # idempotent
    data = _yaml.parse_yaml_for_update(text, "some/dir/dvc.lock")
    assert type(data) is dict and data == LOCK_DATA
    again = io.StringIO()
    _yaml._dump(data, again)
    assert again.getvalue() == text
    # every other file keeps DVC's round-trip loader (dvc.yaml's comments survive an update)
    kept = _yaml.parse_yaml_for_update("# a comment\nstages: {}\n", "dvc.yaml")
    assert type(kept) is not dict and "comment" in _yaml.dumps_yaml(kept)


def _project(root: Path) -> None:
    root.mkdir()
    (root / "params.yaml").write_text("a: {x: 1.0e-06, y: null}\nb: 2\n")
    stages = "\n".join(f"  s{i}:\n    cmd: python -c \"open('o{i}', 'w').write('{i}')\"\n    params: [a, b]\n"
                       f"    deps: [params.yaml]\n    outs: [o{i}]" for i in range(3))
    (root / "dvc.yaml").write_text(f"# stages\nstages:\n{stages}\n")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=root, check=True)


def test_stages_run_through_it_leave_the_lock_dvc_itself_writes(tmp_path):
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    for name, entry in (("plain", ["-m", "dvc"]), ("fast", ["-m", "scalelab.pipeline.dvcrun"])):
        _project(tmp_path / name)
        for i in range(3):  # one stage per process, as the flow runs them: each reads and rewrites dvc.lock
            subprocess.run([sys.executable, *entry, "repro", "--single-item", f"s{i}"], cwd=tmp_path / name,
                           env=env, check=True, capture_output=True)
    plain, fast = ((tmp_path / n / "dvc.lock").read_text() for n in ("plain", "fast"))
    assert fast == plain and plain.count("cmd:") == 3
    assert "# stages" in (tmp_path / "fast" / "dvc.yaml").read_text()
    status = subprocess.run([sys.executable, "-m", "scalelab.pipeline.dvcrun", "status"], cwd=tmp_path / "fast", env=env,
                            check=True, capture_output=True, text=True)
    assert "up to date" in status.stdout


def test_a_write_cut_short_leaves_the_old_file(tmp_path, monkeypatch):
    """A kill in the middle of DVC's write of dvc.lock or of its rwlock (simulated: the writer dies after a partial
    write) leaves the old file whole: DVC's own in-place rewrite left an empty rwlock after a kill -9 of the flow,
    and every later dvc command failed on it (tests/test_crash.py)."""
    import json

    import pytest
    from dvc import rwlock
    from dvc.fs import localfs
    from dvc.utils.serialize import _common

    dvcrun.patch()

    def dies(*args, **kwargs):
        stream = args[1]
        stream.write('{"sta')
        stream.flush()
        raise KeyboardInterrupt  # as SIGINT/SIGKILL would, mid-write

    lock = tmp_path / "dvc.lock"
    lock.write_text("schema: '2.0'\nstages: {}\n")
    with pytest.raises(KeyboardInterrupt):
        _common._dump_data(str(lock), LOCK_DATA, dumper=lambda data, stream: dies(data, stream))
    assert lock.read_text() == "schema: '2.0'\nstages: {}\n"

    (tmp_path / "rwlock").write_text('{"read": {}, "write": {}}')
    monkeypatch.setattr(rwlock.json, "dump", dies)
    with pytest.raises(KeyboardInterrupt), rwlock._edit_rwlock(str(tmp_path), localfs, False) as held:
        held["write"]["out"] = {"pid": os.getpid(), "cmd": "test"}
    monkeypatch.undo()
    assert json.loads((tmp_path / "rwlock").read_text()) == {"read": {}, "write": {}}
    assert not list(tmp_path.glob("*.tmp"))



def test_the_splice_writes_what_the_whole_dump_writes():
    """scalelab.pipeline.lockfile on the committed dvc.lock's first 16 stages, its bytes (folded command lines among
    them; all of its 86 made each of DVC's pure-Python dumps here ~1.5 CPU s): a stage changed in the middle, one
    added, one removed, none changed: each splice equals DVC's whole dump byte for byte; a change outside the stages
    is not spliced."""
    import copy
    import json

    from scalelab.pipeline import lockfile

    head, blocks = lockfile.stage_blocks((Path(__file__).resolve().parents[1] / "dvc.lock").read_text())
    text = head + "".join(list(blocks.values())[:16])  # the head ends with the `stages:` line
    old = _yaml.parse_yaml(text, "dvc.lock")
    names = list(old["stages"])
    assert len(names) == 16 and lockfile.stage_blocks(text) is not None
    assert [n for n in names if old["stages"][n]["cmd"] not in text]  # command lines the emitter folded
    changed, added, removed = (copy.deepcopy(old) for _ in range(3))
    mid = names[len(names) // 2]
    changed["stages"][mid]["cmd"] += " --and a tail long enough that the emitter folds the line"
    changed["stages"][mid]["outs"][0]["md5"] = "0" * 32
    added["stages"]["pretrain@new-0"] = copy.deepcopy(old["stages"][mid]) | {"cmd": "python stages/x.py --seed 0"}
    del removed["stages"][names[1]]
    for new in (copy.deepcopy(old), changed, added, removed):
        expected = io.StringIO()
        DVC_DUMP(new, expected)
        assert lockfile.splice(text, json.loads(json.dumps(old)), new, DVC_DUMP) == expected.getvalue()
    assert lockfile.splice(text, old, changed | {"schema": "3.0"}, DVC_DUMP) is None


def test_each_text_is_parsed_once_and_every_call_gets_its_own_copy():
    """DVC's safe parse, patched: a text read again is not parsed again, and each call gets a fresh object (DVC edits
    what it loads); a text marshal cannot copy (a YAML date) is parsed each time; dvc.yaml's and dvc.lock's loader
    (strictyaml) and params' (load_yaml) go through it."""
    import datetime

    from dvc.utils import strictyaml

    dvcrun.patch()
    text = f"# {os.getpid()} {id(object())}\nstages:\n  a: {{x: [1, 2.5, null, true], y: 'no'}}\n"
    first = _yaml.parse_yaml(text, "dvc.lock")
    first["stages"]["a"]["x"].append(9)
    hits = yamlcache.parsed.cache_info().hits
    second = _yaml.parse_yaml(text, "dvc.lock")
    assert second == {"stages": {"a": {"x": [1, 2.5, None, True], "y": "no"}}}
    assert yamlcache.parsed.cache_info().hits == hits + 1
    assert strictyaml.parse_yaml is _yaml.parse_yaml and _yaml.parse_yaml(text, "x") is not second
    dated = "when: 2026-12-07\n"
    assert _yaml.parse_yaml(dated, "params.yaml") == {"when": datetime.date(2026, 12, 7)}
    assert _yaml.parse_yaml(dated, "params.yaml") == {"when": datetime.date(2026, 12, 7)}


def test_every_dvc_command_in_a_scalelab_project_gets_the_patches(tmp_path, monkeypatch):
    """The venv's hook (scalelab.pipeline.interpreter.guarded) patches DVC in a scalelab project, for any command
    (`dvc status` here), and leaves DVC as it is in any other project."""
    from dvc import rwlock
    from dvc.utils import strictyaml
    from dvc.utils.serialize import _common

    from scalelab.pipeline import interpreter

    seen = []
    for project, scalelab in (("other", False), ("ours", True)):
        for module, name in ((_yaml, "parse_yaml"), (_yaml, "parse_yaml_for_update"), (_yaml, "_dump"),
                             (_yaml, "_dump_data"), (strictyaml, "parse_yaml"), (_common, "_dump_data"),
                             (rwlock, "_edit_rwlock")):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(module, name))  # undone after the test, patched or not
        monkeypatch.setattr(_yaml, "parse_yaml_for_update", DVC_FOR_UPDATE)  # unpatched, whatever ran before
        root = tmp_path / project
        (root / ".dvc").mkdir(parents=True)
        (root / "params.yaml").write_text("seed: 0\n")
        (root / "dvc.yaml").write_text(f"stages:\n  s: {{cmd: python -m {'scalelab.x' if scalelab else 'x'}}}\n")
        monkeypatch.chdir(root)
        code = interpreter.guarded(lambda argv: seen.append(
            getattr(_yaml.parse_yaml_for_update, "scalelab", False)) or 0)(["status"])
        assert code == 0
        monkeypatch.undo()
    assert seen == [False, True]


def test_a_parse_is_stored_for_the_next_process_and_the_lock_writer_stores_what_it_wrote(tmp_path, monkeypatch):
    """Under a project's .dvc/tmp: a text parsed once is read back by a later process without parsing (here: the
    in-process memo cleared, ruamel's loader broken); dvc.lock as DVC writes it is stored as written, so the next
    read of it parses nothing either; a lock holding a type the safe loader would not give back (a tuple) is not stored,
    nor is anything outside a DVC project; the store keeps its newest entries."""
    from dvc.utils.serialize import _common
    from ruamel.yaml import YAML

    dvcrun.patch()
    (tmp_path / ".dvc").mkdir()
    params, lock = str(tmp_path / "params.yaml"), str(tmp_path / "dvc.lock")
    text = f"seed: {os.getpid()}\nlr: 3.0e-3\nnames: [a, 'yes', null]\n"
    assert _yaml.parse_yaml(text, params) == {"seed": os.getpid(), "lr": 3.0e-3, "names": ["a", "yes", None]}
    yamlcache.parsed.cache_clear()  # as a new process
    with monkeypatch.context() as mp:
        mp.setattr(YAML, "load", lambda *a, **k: pytest.fail("parsed again"))
        assert _yaml.parse_yaml(text, params)["names"] == ["a", "yes", None]
        _common._dump_data(lock, LOCK_DATA, dumper=_yaml._dump)  # DVC's write of dvc.lock
        yamlcache.parsed.cache_clear()
        assert _yaml.parse_yaml((tmp_path / "dvc.lock").read_text(), lock) == LOCK_DATA
        with pytest.raises(pytest.fail.Exception):  # outside a project: parsed as DVC would
            _yaml.parse_yaml(text, str(tmp_path / "elsewhere" / "params.yaml"))
        mp.setattr(yamlcache, "_salt", lambda: b"another ruamel\0")  # another parser: nothing stored is its
        yamlcache.parsed.cache_clear()
        with pytest.raises(pytest.fail.Exception):
            _yaml.parse_yaml(text, params)
    yamlcache.parsed.cache_clear()
    with_tuple = {"schema": "2.0", "stages": {"s": {"cmd": "x", "outs": ("o",)}}}
    _common._dump_data(lock, with_tuple, dumper=_yaml._dump)
    yamlcache.parsed.cache_clear()
    with monkeypatch.context() as mp:
        mp.setattr(YAML, "load", lambda *a, **k: pytest.fail("parsed again"))
        with pytest.raises(pytest.fail.Exception):  # not stored: its text is parsed
            _yaml.parse_yaml((tmp_path / "dvc.lock").read_text(), lock)
    assert not yamlcache.plain({"a": (1,)}) and not yamlcache.plain({1: "a"}) and not yamlcache.plain(float("nan"))
    assert yamlcache.plain(LOCK_DATA)
    for i in range(2 * yamlcache.KEEP + 1):
        yamlcache._save(f"n: {i}\n", params, b"N")
    assert len(list((tmp_path / yamlcache.FOLDER).iterdir())) <= 2 * yamlcache.KEEP


def test_a_plain_key_is_looked_up_to_what_dpaths_walk_finds():
    """dvcrun.plain_get against dpath.get itself on every key of a params-like tree, and on what the direct lookup
    leaves to dpath: globs, list indices, int and bool keys (dpath matches `1` to them), missing keys, a default."""
    import dpath

    get = dpath.get
    if getattr(get, "scalelab", False):  # patched in this process already (dvcrun.patch): dpath's own, unwrapped
        get = get.__closure__[0].cell_contents
    fast = dvcrun.plain_get(get)
    tree = {"model": {"sizes": {"a": {"d_model": 32, "n_head": 2}, "b": {"d_model": 48}}, "norm_eps": 1e-6},
            "optim": {"adamw": {"lr": 3e-3, "betas": [0.9, 0.95]}, "muon": {"lr": 0.02, "kwargs": {}}},
            "grid": [{"size": "a"}, {"size": "b"}], "ints": {1: "one", "2": "two", True: "yes"}, "none": None,
            "clash": {"1": "a string key", 1: "an int key"}}  # dpath: `clash.1` matches both, and refuses

    def paths(node, prefix=()):
        if isinstance(node, dict):
            for k, v in node.items():
                yield prefix + (str(k),)
                yield from paths(v, prefix + (str(k),))

    keys = [".".join(p) for p in paths(tree)]
    keys += ["grid.0.size", "grid.1", "optim.*.lr", "model.sizes.?", "ints.1", "ints.2", "model.missing", "nothing",
             ".model.norm_eps", "model..sizes", "model.sizes.a.d_model.deeper"]
    def outcome(fn, key, **kwargs):
        try:
            return "value", fn(tree, key, separator=".", **kwargs)
        except (KeyError, ValueError) as err:
            return "raises", type(err)

    assert len(keys) > 20
    for key in keys:
        assert outcome(fast, key) == outcome(get, key), key
        assert outcome(fast, key, default="d") == outcome(get, key, default="d"), key
    assert fast(tree, "model.sizes", separator=".") is tree["model"]["sizes"]  # the same object, not a copy
