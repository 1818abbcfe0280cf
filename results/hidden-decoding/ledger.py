"""The study's one ledger (claims_c.json, the committed-study contract of docs/workflow.md): the entries of its two
parts, each id and claim prefixed by the part that measured it, since the parts answer different questions (a probe
whose backbone never learned its task cannot show the mechanism, so only v3 is in it; the SmolLM2 run is short).

    python results/hidden-decoding/ledger.py     # rewrites claims_c.json from the parts' claims.json
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
# folder -> how the ledger labels its rows: only the runs that could show the claims (README: the v1 and v2 probes'
# backbones learned nothing of their task; the 6-step continued pretraining is superseded by the 20-step one)
PARTS = {
    "probe-v3": "probe, plain sum of 4 base-3 digits (backbone closes 87.5% of the gap, plateaued)",
    "cpt-20": "SmolLM2 continued pretraining (20 steps, 10k tokens)",
}


def main() -> None:
    entries = []
    for folder, label in PARTS.items():
        for e in json.loads((HERE / folder / "claims.json").read_text()):
            entries.append(e | {"id": f"{folder}.{e['id']}", "claim": f"{label}: {e['claim']}"})
    (HERE / "claims_c.json").write_text(json.dumps(entries, indent=2) + "\n")


if __name__ == "__main__":
    main()
