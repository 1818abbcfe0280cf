"""Studies: a named grid of the pipeline's own stage cells, run resumably and kept in results/<name>/.

    scalelab study NAME [--plan] [--max-minutes M] [--cells PATTERN] [--refresh] [--workers N]

A study's spec (configs/studies/<name>.yaml, `spec`) names a params profile, the DVC stage cells it runs and the
generator of its ledger. `grid` resolves those cells with DVC and gives each its key (stage, cell and resolved
params) and the hash of the code and inputs it reads; `cells` keeps each finished cell's small results under
results/<name>/cells/ and says which are done, stale or missing; `workspace` is the study's own DVC workspace, so
the user's params.yaml, dvc.lock and metrics are never touched; `gate` is where the pipeline flow asks whether a cell
may start (the study's time budget); `costs` estimates what is left; `run` ties them together; `ledger` rewrites the
ledger, study.json and the README's generated parts; `port` converts a study committed before specs existed.
"""
