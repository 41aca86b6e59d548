"""The scaling-study runner: ``python -m cropscale study`` (layer 5)."""
