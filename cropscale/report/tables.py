"""Markdown and CSV tables of figures with their evidence labels and footnotes (report and study).

Markdown: one column per :class:`Column` plus ``Evidence`` (the labels of the row's figures); an n/a
cell or a qualified value carries a footnote number, the footnotes (each distinct text once) follow
the table. CSV: per figure column ``<key>``, ``<key>_evidence``, ``<key>_note`` (the reason when n/a,
else the qualifier); descriptive columns as they are, with a ``<key>_note`` column where some row
qualifies them; numbers unrounded. Files are written atomically.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cropscale.files import atomic_write_text
from cropscale.runs.figures import Column
from cropscale.runs.rules import Figure


@dataclass
class TableRow:
    """One table row: descriptive values and cells, figures, and the row's evidence label.

    ``values`` are plain descriptive values, ``descriptive`` cells carry a qualifier or reason,
    ``figures`` fill the figure columns; ``evidence`` labels plain (non-:class:`Figure`) figure values.
    """

    values: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    descriptive: dict[str, Figure] = field(default_factory=dict)
    evidence: str | None = None

    @classmethod
    def of(cls, obj: Any, columns: Sequence[Column]) -> TableRow:
        """The row of an object with ``figures``, ``descriptive``, ``evidence`` and the columns' attributes.

        For example a :class:`~cropscale.runs.record.RunRecord` or a precision pair.
        """
        return cls(values={c.key: getattr(obj, c.key, None) for c in columns if not c.figure},
                   figures=dict(getattr(obj, "figures", {}) or {}),
                   descriptive=dict(getattr(obj, "descriptive", {}) or {}),
                   evidence=getattr(obj, "evidence", None))


@dataclass
class Table:
    """A rendered table: its Markdown text and CSV text."""

    markdown: str
    csv: str


def fmt(value: Any, spec: str) -> str:
    """``value`` formatted with ``spec`` (``d`` specs round to int); ``n/a`` for None."""
    if value is None:
        return "n/a"
    if spec and isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(int(value), spec) if spec.endswith("d") else format(value, spec)
    return str(value)


def _md(text: str) -> str:
    return text.replace("|", "/").replace("\n", " ")


class _Notes:
    """Footnotes: each distinct text once, numbered from 1."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def mark(self, text: str | None) -> str:
        if not text:
            return ""
        if text not in self.texts:
            self.texts.append(text)
        return f" [{self.texts.index(text) + 1}]"


def _figure_cell(row: TableRow, col: Column, notes: _Notes, labels: list[str], csv_row: dict[str, Any]) -> str:
    fig = row.figures.get(col.key)
    if not isinstance(fig, Figure):
        fig = Figure(fig, row.evidence)
    if fig.evidence and fig.evidence not in labels:
        labels.append(fig.evidence)
    extra = fig.why if fig.value is None else fig.note
    csv_row[col.key] = "" if fig.value is None else fig.value
    csv_row[f"{col.key}_evidence"] = fig.evidence or ""
    csv_row[f"{col.key}_note"] = extra or ""
    return fmt(fig.value, col.fmt) + notes.mark(extra if fig.value is None or col.qualifiers else None)


def _descriptive_cell(row: TableRow, col: Column, notes: _Notes, csv_row: dict[str, Any]) -> str:
    desc = row.descriptive.get(col.key)
    if isinstance(desc, Figure):
        extra = desc.why if desc.value is None else desc.note
        csv_row[col.key] = "" if desc.value is None else desc.value
        csv_row[f"{col.key}_note"] = extra or ""
        return fmt(desc.value, col.fmt) + notes.mark(extra if desc.value is None or col.qualifiers else None)
    value = row.values.get(col.key)
    csv_row[col.key] = "" if value is None else value
    return fmt(value, col.fmt)


def _fieldnames(rows: Sequence[TableRow], columns: Sequence[Column]) -> list[str]:
    names: list[str] = []
    for c in columns:
        if c.figure:
            names += [c.key, f"{c.key}_evidence", f"{c.key}_note"]
        elif any(isinstance(r.descriptive.get(c.key), Figure) for r in rows):
            names += [c.key, f"{c.key}_note"]
        else:
            names.append(c.key)
    return [*names, "evidence"]


def render_table(rows: Sequence[TableRow], columns: Sequence[Column], title: str | None = None,
                 intro: str | None = None) -> Table:
    """The Markdown (with a ``## title`` heading and ``intro`` paragraph when given) and CSV texts."""
    header = [c.header for c in columns] + ["Evidence"]
    md = ([f"## {title}", ""] if title else []) + ([intro, ""] if intro else [])
    md += ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    notes = _Notes()
    csv_rows = []
    for row in rows:
        labels: list[str] = []
        csv_row: dict[str, Any] = {}
        cells = [_figure_cell(row, c, notes, labels, csv_row) if c.figure else _descriptive_cell(row, c, notes, csv_row)
                 for c in columns]
        evidence = ", ".join(labels) or row.evidence or "n/a"
        csv_row["evidence"] = evidence
        md.append("| " + " | ".join(_md(c) for c in cells + [evidence]) + " |")
        csv_rows.append(csv_row)
    if notes.texts:
        md += ["", *[f"[{i}] {_md(n)}" for i, n in enumerate(notes.texts, 1)]]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=_fieldnames(rows, columns), restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows)
    return Table("\n".join(md) + "\n", buffer.getvalue())


def write_table(rows: Sequence[TableRow], out_dir: str | Path, stem: str, columns: Sequence[Column],
                title: str | None = None, intro: str | None = None) -> tuple[Path, Path]:
    """Write ``<stem>.md`` and ``<stem>.csv`` in ``out_dir`` (created if needed), atomically.

    Returns:
        ``(markdown_path, csv_path)``.

    Raises:
        CropScaleError: the folder cannot be created or written (named).
    """
    table = render_table(rows, columns, title, intro)
    out = Path(out_dir)
    return atomic_write_text(out / f"{stem}.md", table.markdown), atomic_write_text(out / f"{stem}.csv", table.csv)
