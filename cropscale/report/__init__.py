"""The presentation floor (layer 5): tables, plots, the end-of-fit summary and the comparison statistics.

:mod:`~cropscale.report.command` is ``python -m cropscale report``; the study and the command line import the
rest. Everything here reads runs through :mod:`cropscale.runs` and writes nothing the callbacks read.
"""
