"""The user-facing errors of cropscale (layer 0: imports nothing of the project).

:class:`CropScaleError` is the family: a bad input file, a bad argument or a bad configuration. Its
message names the file, patch or argument at fault; the CLI prints it as one line
(``cropscale: error: ...``) and exits with status 2 instead of showing a traceback.
:func:`user_error_text` is that line, the same whether the error was raised in the main process or in a
DataLoader worker (the CLI prints it; ``run.json`` records it).
"""

from __future__ import annotations

import re


class CropScaleError(ValueError):
    """A user-facing error: bad input data, a bad argument or a bad configuration.

    The message names the file, patch or argument at fault. The CLI prints it as one paragraph
    (``cropscale: error: ...``) and exits with status 2 instead of showing a traceback.
    """


_WORKER_WRAPPER = re.compile(r"^Caught \w+ in DataLoader worker process \d+\.\s+Original Traceback", re.S)


def user_error_text(err: BaseException) -> str:
    """The one-line text of a user error, unwrapped when a DataLoader worker raised it.

    PyTorch re-raises a worker's exception in the main process as the same type with the message
    ``Caught <Type> in DataLoader worker process <n>. Original Traceback ...`` followed by the worker's
    whole traceback; the worker's own message is what follows ``<module>.<Type>: `` on the traceback's
    last such line. Whitespace runs (newlines included) become one space.
    """
    text = str(err)
    if _WORKER_WRAPPER.match(text):
        name = re.escape(type(err).__name__)
        found = list(re.finditer(rf"^(?:[\w.]+\.)?{name}: ", text, re.M))
        if found:
            text = text[found[-1].end():]
    return " ".join(text.split())
