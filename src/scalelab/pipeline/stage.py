"""What every DVC stage script shares: params validated before any compute, and bad
input reported as one clear line, not a traceback, with an exit code per kind of error (1 stays Python's own: a
crash, a bug).

    def main(params: Params) -> None: ...
    if __name__ == "__main__":
        sys.exit(stage_main(main))
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # imported where used: a stage under the flow hands off first, in ~0.03 CPU s, not the config's 0.25
    from scalelab.config import Params

EXIT_PARAMS = 2  # params: schema, YAML syntax, names (scalelab.config); a stage interpreter running other code
EXIT_DATA = 3  # data and paths: corpus, shards, tokenizer, a seq_len the data cannot fill (scalelab.data.DataError)
EXIT_NONFINITE = 4  # training diverged: a NaN/inf loss or gradient norm (the last good checkpoint is kept)


def stage_main(body: Callable[[Params], None], params_path: str = "params.yaml", name: str | None = None) -> int:
    """Load and validate `params_path`, then run `body(params)`. Exit EXIT_PARAMS on a params error (before any
    compute: the stage writes nothing), EXIT_DATA on a data error, EXIT_NONFINITE when training diverges; the one-line
    message names what is wrong."""
    from scalelab.pipeline.handoff import handoff

    handoff()  # under the flow: run in its warm server, whose imports are done (scalelab.pipeline.warm); else go on here
    from scalelab.runtime.log import setup as setup_logging

    setup_logging()  # one log format; the libraries' start-up noise off (scalelab.runtime.log)
    from scalelab.pipeline.interpreter import check_project_code

    def run() -> None:
        from scalelab.config import load_params

        check_project_code()  # under DVC: the code DVC hashes is the code that runs (pipeline/interpreter.py)
        body(load_params(params_path))

    return reported(name or sys.argv[0], run)


def reported(name: str, fn: Callable[[], object]) -> int:
    """Run `fn`; a params, data or non-finite-training error becomes one line `name: message` on stderr and its exit
    code (anything else is a bug and keeps its traceback)."""
    from scalelab.config import ParamsError
    from scalelab.data import DataError  # light: scalelab.data loads its submodules on first use

    # FloatingPointError: NonFiniteGuard, an expected outcome of bad hyperparameters, not a bug
    codes = ((ParamsError, EXIT_PARAMS), (DataError, EXIT_DATA), (FloatingPointError, EXIT_NONFINITE))
    try:
        fn()
    except (ParamsError, DataError, FloatingPointError) as err:
        print(f"{name}: {err}", file=sys.stderr)
        return next(code for kind, code in codes if isinstance(err, kind))
    return 0
