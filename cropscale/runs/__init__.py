"""The run folder: the typed records the callbacks write into ``run.json`` and the one reader of a run (layer 1)."""
