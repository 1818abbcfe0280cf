"""Pre-flight check: everything about params and inputs that can be known before DVC touches anything.

    scalelab check                        # params.yaml: YAML, schema, names, every grid cell's model, the machine
                                          # settings merged in; the local inputs it names (corpus, tokenizer file)
    scalelab check --shards data/tokens   # also: the token shards can fill seq_len and the val windows
    scalelab check --stage                # the DVC stage `validate`: the above, then its marker file
    (the same as `python -m scalelab.pipeline.check ...`)

Why first: DVC deletes a stage's outs right before running its command, so a stage that refuses a mistyped key has
already lost its previous results. `scalelab repro` runs this before the flow, and dvc.yaml's `validate` stage, which
every stage depends on, runs it at the head of the DAG: DVC stops a repro at its first failing stage, before removing
any other stage's outs; as that stage it also checks that its interpreter runs this project's code
(scalelab.pipeline.interpreter). One line per error; exit 0 ok, 2 params, 3 data (scalelab.pipeline.stage's codes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from scalelab.config import Params, load_params
from scalelab.pipeline.stage import reported

MARKER = Path("data/validated.json")  # the `validate` stage's out; constant content, so it never reruns anything


def check_cells(params: Params) -> None:
    """Every cell of the pretrain matrices resolves to a valid model."""
    g = params.pretrain.grid
    cells = [(size, variant, "base") for size in g.sizes for variant in g.variants]
    cells += [(size, variant, recipe) for recipe in g.recipes for size in g.recipe_sizes for variant in g.recipe_variants]
    for size, variant, recipe in cells:
        params.resolve_model(size, variant, vocab_size=params.tokenizer.vocab_size, recipe=recipe)


def check_inputs(params: Params) -> None:
    """The local files the params name exist (raises DataError naming the key and the path)."""
    from scalelab import project_root
    from scalelab.data import DataError

    root = project_root()  # relative paths are the stages' (they run at the project root)
    corpus = params.prepare.corpus
    if not (root / corpus.path).exists():
        raise DataError(f"prepare.corpus.path: {corpus.path} does not exist (dvc.yaml's prepare stage depends on it; "
                        "the shipped profiles use the repo's corpus/ folder)")
    if params.tokenizer.kind == "file" and not (root / params.tokenizer.path).is_file():
        raise DataError(f"tokenizer.path: {params.tokenizer.path} is not a file")


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


def preflight(params_path: str | Path = "params.yaml", shards_dir: str | Path | None = None) -> Params:
    """All checks; raises ParamsError or DataError with a one-line message."""
    from scalelab.pipeline.interpreter import check_project_code

    check_project_code()  # as the DVC stage `validate`: this interpreter runs this project's code
    params = load_params(params_path)
    check_cells(params)
    check_inputs(params)
    if shards_dir is not None:
        check_shards(params, shards_dir)
    return params


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scalelab check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--shards", help="a token shard folder (data/tokens) to check against pretrain's windows")
    ap.add_argument("--stage", action="store_true", help=f"run as the DVC stage `validate`: write {MARKER}")
    args = ap.parse_args(argv)
    if code := reported("check", lambda: preflight(args.params, args.shards)):
        return code
    if args.stage:
        from scalelab.data import write_json_atomic

        write_json_atomic(MARKER, {"params": "valid"})
    print(f"check: {args.params}: params valid" + (f"; shards in {args.shards} fit" if args.shards else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
