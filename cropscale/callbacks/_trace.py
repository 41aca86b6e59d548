"""The step-timing trace file: rows buffered on the training thread, formatted and written by a background thread.

:class:`TraceWriter` takes rows (host numbers, no formatting) in batches and writes them as Extra-P JSON
lines from its own thread, one ``write`` + ``flush`` per batch, so the file only ever holds whole lines.
:meth:`TraceWriter.drain` waits until everything handed over is on disk; :meth:`TraceWriter.close` drains
and closes (what the callback does at epoch end, at the end of training and on an exception, a SIGTERM
included, so that the file is complete after a kill that Lightning handles).
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Sequence
from typing import Any

TraceRow = tuple[list[float | None], int, int, bool, int | None]
"""One step: its figures in the order of ``names``, global step, epoch, warm-up flag, samples."""


class TraceWriter:
    """Appends trace rows to ``path`` from a background thread.

    Args:
        path: the JSON-lines file (opened for appending, so a resumed run continues it).
        names: the figure names, in the order of each row's figures (``step`` is ``train_step``, the others
            ``train_step-><name>``).
        params: the Extra-P parameters written in every line.
        rank: the global rank written in every line.

    Raises:
        OSError: when ``path`` cannot be opened.
    """

    def __init__(self, path: str, names: Sequence[str], params: dict[str, Any], rank: int) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._callpaths = ["train_step" if n == "step" else f"train_step->{n}" for n in names]
        self._params, self._rank = dict(params), rank
        self._queue: queue.Queue[list[TraceRow] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="cropscale-step-trace", daemon=True)
        self._thread.start()

    def put(self, rows: list[TraceRow]) -> None:
        """Hand ``rows`` over to the writer thread (no formatting here)."""
        if rows:
            self._queue.put(rows)

    def drain(self) -> None:
        """Wait until every row handed over is written and flushed; re-raise a write error of the thread."""
        self._queue.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """Drain, stop the thread and close the file (idempotent)."""
        if self._file.closed:
            return
        self._queue.put(None)
        self._thread.join()
        self._file.close()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        while True:
            rows = self._queue.get()
            try:
                if rows is None:
                    return
                if self._error is None:
                    self._write(rows)
            except Exception as exc:  # noqa: BLE001 - handed to the training thread at drain/close
                self._error = exc
            finally:
                self._queue.task_done()

    def _write(self, rows: list[TraceRow]) -> None:
        lines = []
        for figures, step, epoch, warmup, samples in rows:
            for callpath, value in zip(self._callpaths, figures, strict=True):
                if value is None:
                    continue
                lines.append(json.dumps({
                    "params": self._params, "callpath": callpath, "metric": "time", "value": value,
                    "rank": self._rank, "step": step, "epoch": epoch, "warmup": warmup, "samples": samples,
                }))
        if lines:
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
