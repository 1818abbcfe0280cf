"""Pre-flight check: everything about params and inputs that can be known before DVC touches anything.

    scalelab check                        # params.yaml: YAML, schema, names, every grid cell's model, the machine
                                          # settings merged in; the local inputs it names (corpus, tokenizer file);
                                          # each optimizer of `optim` built by its library; what the schema cannot
                                          # see (scalelab.pipeline.runnable): names DVC cannot address as params
                                          # keys, CUDA on a machine without it, a hub split unreadable offline
    scalelab check --shards data/tokens   # also: the token shards can fill seq_len and the val windows
    scalelab check --stage                # the DVC stage `validate`: the above, then its marker file
    (the same as `python -m scalelab.pipeline.check ...`)

Why first: DVC deletes a stage's outs right before running its command, so a stage that refuses a mistyped key has
already lost its previous results. Three places run it before that: `scalelab repro`, before the flow; dvc.yaml's
`validate` stage, which every stage depends on, at the head of the DAG (DVC stops a repro at its first failing stage;
as that stage it also checks that its interpreter runs this project's code, scalelab.pipeline.interpreter); and DVC's
own process, for every `dvc repro` and `dvc exp run` (with `-s`, `validate` does not run): the venv's hook
(scalelab.pipeline.interpreter) calls `dvc_preflight` before DVC's command starts. One line per error; exit 0 ok,
2 params, 3 data (scalelab.pipeline.stage's codes).

The check's verdicts are remembered by the hash of what they read (the project's .cache/scalelab/checked.json):
the schema's (~0.4 s of imports) for the hook, which runs at every DVC call, and the optimizer builds' (torch and
pytorch-optimizer: seconds) for all three. This module imports nothing heavy at the top: the hook loads it in DVC's
process, where an unchanged project costs a few file reads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scalelab.config import Params

MARKER = Path("data/validated.json")  # the `validate` stage's out; constant content, so it never reruns anything
STAMP = Path(".cache") / "scalelab" / "checked.json"  # under the project root: the verdicts remembered
KEEP = 32  # remembered verdicts per kind (a few profiles' worth)


def check_cells(params: Params) -> None:
    """Every cell of the pretrain matrices resolves to a valid model."""
    g = params.pretrain.grid
    cells = [(size, variant, "base") for size in g.sizes for variant in g.variants]
    cells += [(size, variant, recipe) for recipe in g.recipes for size in g.recipe_sizes for variant in g.recipe_variants]
    for size, variant, recipe in cells:
        params.resolve_model(size, variant, vocab_size=params.tokenizer.vocab_size, recipe=recipe)


def required_inputs(params: Params) -> list[tuple[str, str, str]]:
    """(key, path, what it must be) of the local files the params name; relative paths are the stages' (they run at
    the project root)."""
    need = [("prepare.corpus.path", str(params.prepare.corpus.path), "exists")]
    if params.tokenizer.kind == "file":
        need.append(("tokenizer.path", str(params.tokenizer.path), "file"))
    return need


def check_inputs(params: Params, root: Path | None = None) -> None:
    """The local files the params name exist (raises DataError naming the key and the path)."""
    from scalelab import project_root

    root = project_root() if root is None else root
    for key, path, kind in required_inputs(params):
        if not _present(root / path, kind):
            from scalelab.data import DataError

            if key == "prepare.corpus.path":
                raise DataError(f"{key}: {path} does not exist (dvc.yaml's prepare stage depends on it; the shipped "
                                "profiles use the repo's corpus/ folder)")
            raise DataError(f"{key}: {path} is not a file")


def _present(path: Path, kind: str) -> bool:
    return path.is_file() if kind == "file" else path.exists()


def check_shards(params: Params, shards_dir: str | Path) -> None:
    """The shards described by `shards_dir/meta.json` can fill the training windows and the validation windows."""
    from scalelab.data import DataError
    from scalelab.data.shards import check_windows

    meta_path = Path(shards_dir) / "meta.json"
    if not meta_path.is_file():
        raise DataError(f"no {meta_path} (run the tokenize stage first, or drop --shards)")
    shards = json.loads(meta_path.read_text())["shards"]
    pre = params.pretrain
    check_windows(shards["train"]["tokens"], shards["val"]["tokens"], seq_len=pre.seq_len, val_tokens=pre.val_tokens)


# ---------------------------------------------------------------- the optimizers, built
def build_optimizers(optim: dict[str, dict]) -> None:
    """Each optimizer config of `optim` (name -> OptimizerConfig fields) built as a stage builds it (its registry
    factory and the AdamW side-group) on a model of one matrix and one scale vector: a value of the right type that
    the library refuses (betas outside [0, 1), a negative Sophia `p`, Nesterov with dampening) fails here, naming its
    key, not in a stage whose outs DVC has removed. Imports torch and the optimizer libraries."""
    import types
    import warnings

    import torch
    from torch import nn

    from scalelab.config import OptimizerConfig, ParamsError, ScaleConfig
    from scalelab.optim import build_optimizers as build

    class OneMatrix(nn.Module):
        """A matrix and a scale vector, and the head layout Adam-mini partitions by."""

        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(4, 4))
            self.gain = nn.Parameter(torch.ones(4))
            self.cfg = types.SimpleNamespace(d_model=4, n_head=1, head_dim=4, kv_heads=1)

        def param_kind(self, name: str) -> str:
            return "matrix" if name == "weight" else "input_scale"

    for key, fields in optim.items():
        cfg = OptimizerConfig.model_validate(fields)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the libraries' notes on settings (foreach, fused), not errors
                build(OneMatrix(), cfg, ScaleConfig())
        except (ValueError, TypeError, RuntimeError) as err:
            why = " ".join(str(err).split())
            raise ParamsError(f"optim.{key}: {cfg.name} refuses these settings: {why}") from None


def check_optimizers(params: Params, stamp_dir: Path | None = None) -> None:
    """`build_optimizers` for params' `optim`, unless these settings were built by this code before (remembered in
    `stamp_dir`'s stamp; None: always build)."""
    optim = {k: v.model_dump(mode="json") for k, v in params.optim.items()}
    key = _optim_key(optim)
    if stamp_dir is not None and _recall(stamp_dir, "optimizers", key) is not None:
        return
    build_optimizers(optim)
    if stamp_dir is not None:
        _remember(stamp_dir, "optimizers", key, {})


def _optim_key(optim: dict[str, dict]) -> str:
    return _sha(json.dumps(optim, sort_keys=True).encode(), _code_key().encode())


@lru_cache(maxsize=None)
def _code_key() -> str:
    """What a verdict depends on besides the params: this scalelab's schema, check and optimizer code, and the
    installed optimizer libraries (each by its package's __init__ file's size and time: a reinstall changes them;
    importlib.metadata's versions cost 0.25 s here)."""
    import importlib.util

    libs = []
    for name in ("torch", "pytorch_optimizer"):
        spec = importlib.util.find_spec(name)
        st = os.stat(spec.origin) if spec is not None and spec.origin else None
        libs.append(f"{name}:{st.st_size}:{st.st_mtime_ns}" if st else f"{name}:-")
    from scalelab.runtime import code

    return _sha(code.digest("scalelab.pipeline.check", "scalelab.optim").encode(), " ".join(libs).encode())


def _params_key(params_file: Path, text: bytes) -> str:
    """A params verdict's key: the params file's name (params.yaml refuses inline machine settings) and content, the
    machine file load_params merges in, the code."""
    from_env = os.environ.get("SCALELAB_MACHINE", "")  # scalelab.config.machine's MACHINE_ENV
    machine = Path(from_env) if from_env else params_file.parent / "machine.yaml"
    return _sha(params_file.name.encode(), text, from_env.encode(), machine.read_bytes() if machine.is_file() else b"-",
                _code_key().encode())


# ---------------------------------------------------------------- remembered verdicts
def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(hashlib.sha256(p).digest())
    return h.hexdigest()


def _recall(stamp_dir: Path, kind: str, key: str) -> dict | None:
    try:
        return json.loads((stamp_dir / STAMP).read_text()).get(kind, {}).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def _remember(stamp_dir: Path, kind: str, key: str, entry: dict) -> None:
    """Add a passed check to the stamp (atomically; a stamp that cannot be written only costs a re-check)."""
    path = stamp_dir / STAMP
    try:
        data = json.loads(path.read_text())
        data = data if isinstance(data, dict) and all(isinstance(v, dict) for v in data.values()) else {}
    except (OSError, ValueError):  # none yet, or unreadable: started afresh
        data = {}
    try:
        seen = {k: v for k, v in data.get(kind, {}).items() if k != key}
        data[kind] = dict(list(seen.items())[-(KEEP - 1):] + [(key, entry)])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass


# ---------------------------------------------------------------- the checks
def preflight(params_path: str | Path = "params.yaml", shards_dir: str | Path | None = None) -> Params:
    """All checks; raises ParamsError or DataError with a one-line message."""
    from scalelab import store_root
    from scalelab.config import load_params
    from scalelab.config.machine import machine_path
    from scalelab.pipeline import runnable
    from scalelab.pipeline.interpreter import check_project_code

    check_project_code()  # as the DVC stage `validate`: this interpreter runs this project's code
    params = load_params(params_path)
    check_cells(params)
    runnable.check_keys(params, Path(params_path).resolve().parent / "dvc.yaml")
    check_inputs(params)
    runnable.check_cuda(params, machine_path(params_path))  # torch imported only when CUDA is asked for
    runnable.check_hub_offline(params)  # datasets imported only offline with a hub split named
    check_optimizers(params, store_root())
    path = Path(params_path)  # remembered for DVC's hook (dvc_preflight), which reads the same key
    _remember(store_root(), "params", _params_key(path, path.read_bytes()), {"inputs": required_inputs(params)})
    if shards_dir is not None:
        check_shards(params, shards_dir)
    return params


def dvc_preflight(root: Path, overrides: list[str] = ()) -> None:
    """What DVC's own process checks before `dvc repro` or `dvc exp run` starts (scalelab.pipeline.interpreter's
    hook): `root`'s params.yaml with the run's `-S` overrides applied and its machine file, as `preflight` does, the
    optimizers built in a child process (DVC's own imports no torch). Raises ParamsError or DataError."""
    params_file = root / "params.yaml"
    text = _overridden(params_file, overrides) if overrides else params_file.read_bytes()
    key = _params_key(params_file, text)
    seen = _recall(root, "params", key)
    if seen is not None and all(_present(root / path, kind) for _, path, kind in seen.get("inputs", [])):
        return
    params = _parse(params_file, text)
    check_cells(params)
    from scalelab.pipeline.runnable import check_keys

    check_keys(params, root / "dvc.yaml")  # CUDA and hub reads are the validate stage's (torch, datasets)
    check_inputs(params, root)
    optim = {k: v.model_dump(mode="json") for k, v in params.optim.items()}
    if _recall(root, "optimizers", okey := _optim_key(optim)) is None:
        _build_in_child(optim)
        _remember(root, "optimizers", okey, {})
    _remember(root, "params", key, {"inputs": required_inputs(params)})


def _parse(params_file: Path, text: bytes) -> Params:
    """`text` as the content of `params_file` (its machine file merged in, as load_params does)."""
    import yaml

    from scalelab.config import ParamsError, machine, parse_params
    from scalelab.config.params import read_yaml
    from scalelab.runtime import yamlio

    if text == params_file.read_bytes():
        raw = read_yaml(params_file)
    else:
        try:
            raw = yamlio.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ParamsError(f"{params_file.name} with the -S overrides: YAML error: {' '.join(str(err).split())}")
    local, source = machine.file_layer(raw, params_file, params_file.name)
    return parse_params(raw, source, local)


def _overridden(params_file: Path, overrides: list[str]) -> bytes:
    """params.yaml's bytes as `dvc exp run -S ...` will write them: DVC's own override code, on a copy."""
    import shutil
    import tempfile

    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / params_file.name
        shutil.copyfile(params_file, copy)
        apply_overrides(copy, list(overrides))
        return copy.read_bytes()


def _build_in_child(optim: dict[str, dict]) -> None:
    """`build_optimizers(optim)` in a child interpreter (this one, DVC's, keeps torch out); its refusal re-raised."""
    from scalelab.config import ParamsError

    res = subprocess.run([sys.executable, "-m", "scalelab.pipeline.check", "--build-optimizers", "-"],
                         input=json.dumps(optim), capture_output=True, text=True)
    if res.returncode == 2:
        raise ParamsError((res.stderr.strip().splitlines() or ["an optimizer refuses its settings"])[-1]
                          .removeprefix("check: "))
    if res.returncode != 0:  # not a verdict on the params (a broken install): the stages will say what it is
        print(f"scalelab: optimizer check skipped ({' '.join(res.stderr.split()[-12:])})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from scalelab.pipeline.stage import reported

    ap = argparse.ArgumentParser(prog="scalelab check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--shards", help="a token shard folder (data/tokens) to check against pretrain's windows")
    ap.add_argument("--stage", action="store_true", help=f"run as the DVC stage `validate`: write {MARKER}")
    ap.add_argument("--build-optimizers", metavar="JSON", help=argparse.SUPPRESS)  # the hook's child: `-` for stdin
    args = ap.parse_args(argv)
    if args.build_optimizers:
        text = sys.stdin.read() if args.build_optimizers == "-" else Path(args.build_optimizers).read_text()
        return reported("check", lambda: build_optimizers(json.loads(text)))
    if code := reported("check", lambda: preflight(args.params, args.shards)):
        return code
    if args.stage:
        from scalelab.data import write_json_atomic

        write_json_atomic(MARKER, {"params": "valid"})
    print(f"check: {args.params}: params valid" + (f"; shards in {args.shards} fit" if args.shards else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
