"""What every DVC stage script shares (DESIGN "Contracts: a stage"): params validated before any compute, and bad
input reported as one clear line, not a traceback.

    def main(params: Params) -> None: ...
    if __name__ == "__main__":
        sys.exit(stage_main(main))
"""

from __future__ import annotations

import sys
from typing import Callable

from scalelab.config import Params, ParamsError, load_params

EXIT_PARAMS, EXIT_DATA = 2, 1


def stage_main(body: Callable[[Params], None], params_path: str = "params.yaml", name: str | None = None) -> int:
    """Load and validate `params_path`, then run `body(params)`. Exit 2 on a params error (before any compute: the
    stage writes nothing), 1 on a data error; the message names what is wrong."""
    from scalelab.data import DataError  # light: scalelab.data loads its submodules on first use

    name = name or sys.argv[0]
    try:
        body(load_params(params_path))
    except ParamsError as err:
        print(f"{name}: {err}", file=sys.stderr)
        return EXIT_PARAMS
    except DataError as err:
        print(f"{name}: {err}", file=sys.stderr)
        return EXIT_DATA
    return 0
