"""Small public models for tests, probes and microbenchmarks (layer 4), as Lightning's ``demos``.

=========  =====================================================================
module     content
=========  =====================================================================
``toy``    :class:`~cropscale.testing.toy.ToyTask`: one ``nn.Linear`` with injectable NaN and overflow
``faults`` faults to inject into a real run from its configuration: a rank that raises or is killed,
           a kill or a full disk in the middle of a checkpoint write
=========  =====================================================================
"""
