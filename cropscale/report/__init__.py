"""The quality-and-speed report of runs and benchmarks: ``python -m cropscale report`` (layer 5)."""
