"""Where and how this process runs: its threads and devices (placement), its log lines and progress (log), the code
it runs (code), and how it reads scalelab's own YAML files (yamlio).

The base of the layers: it imports no other scalelab module, so data, training and compression use it and the
pipeline above them can too, with no cycle.
"""
