"""Small public models for tests, probes and microbenchmarks (layer 4), as Lightning's ``demos``.

=========  =====================================================================
module     content
=========  =====================================================================
``toy``    :class:`~cropscale.testing.toy.ToyTask`: one ``nn.Linear`` with injectable NaN and overflow
=========  =====================================================================
"""
