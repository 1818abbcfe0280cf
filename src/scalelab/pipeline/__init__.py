"""Running stages: a stage's entry and exit codes (stage), the params and data check before any outs are touched
(check), where a cell runs and on how many threads (placement), warm-started stage processes (warm, forkcheck), DVC
invoked fast and safely (dvcrun), switching profiles (profile), and one log format with progress lines (log).

Nothing is imported here: the layers below import `scalelab.pipeline.log` and `.placement`, which import no other
scalelab module, so importing them stays cheap and the package has no cycle.
"""
