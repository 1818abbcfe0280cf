"""Running stages: a stage's entry and exit codes (stage), the params and data check before any outs are touched
(check), warm-started stage processes (warm, handoff, forkcheck; under a plain `dvc repro`: repro_warm), DVC invoked
fast and safely (dvcrun) and switching profiles (profile). The top of the layers: it uses everything below, nothing
below uses it.
"""
