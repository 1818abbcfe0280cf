"""The study's one ledger (claims_c.json, the committed-study contract of docs/workflow.md): the entries of its three
parts, each id and claim prefixed by the part that measured it, since the parts answer different questions (a probe
whose backbone never learned its task cannot show the mechanism; the SmolLM2 run is a few steps long).

    python results/hidden-decoding/ledger.py     # rewrites claims_c.json from the parts' claims.json
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = {  # folder -> how the ledger labels its rows
    "probe": "probe K=5 (backbone never learned the task)",
    "probe-k3": "probe K=3 (backbone never learned the task)",
    "cpt": "SmolLM2 continued pretraining (6 steps)",
}


def main() -> None:
    entries = []
    for folder, label in PARTS.items():
        for e in json.loads((HERE / folder / "claims.json").read_text()):
            entries.append(e | {"id": f"{folder}.{e['id']}", "claim": f"{label}: {e['claim']}"})
    (HERE / "claims_c.json").write_text(json.dumps(entries, indent=2) + "\n")


if __name__ == "__main__":
    main()
