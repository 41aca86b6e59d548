"""The user-facing errors of cropscale (layer 0: imports nothing of the project).

:class:`CropScaleError` is the family: a bad input file, a bad argument or a bad configuration. Its
message names the file, patch or argument at fault; the CLI prints it as one line
(``cropscale: error: ...``) and exits with the class's :attr:`~CropScaleError.exit_status` (2 for every
class here) instead of showing a traceback. Each error is raised, typed, where the problem is found; a
third-party exception about the user's input (Lightning's checks of Trainer arguments, ``torch.load`` of a
file that is no checkpoint, a checkpoint's weights that do not fit the network) is converted into one of
these at the one place the project calls that library, so the CLI maps types to exit statuses and never
reads message text.

=========================  ======  ==========================================================
class                      status  raised for
=========================  ======  ==========================================================
:class:`CropScaleError`    2       bad input data (files, patches); the base of the family
:class:`ConfigError`       2       a bad argument or configuration option (names the option)
:class:`TrainerArgumentError`  2   a ``--trainer.*`` value that Lightning's Trainer refused
:class:`CheckpointError`   2       a ``--ckpt_path`` that is missing, no Lightning checkpoint, or
                                   of another network
=========================  ======  ==========================================================

:func:`user_error_text` is the one line, the same whether the error was raised in the main process or in a
DataLoader worker (the CLI prints it; ``run.json`` records it).
"""

from __future__ import annotations

import re
import warnings

_FORMAT_WARNING = warnings.formatwarning


class DataWarning(UserWarning):
    """A fact about the data that the run's user must know but that does not stop the run.

    A modality the model is trained without, an epoch padded with repeated samples, a scan cache that cannot be
    written. The CLI prints it as one line, ``cropscale: warning: <message>`` (:func:`format_warning`).
    """


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   line: str | None = None) -> str:
    """:func:`warnings.formatwarning` with a :class:`DataWarning` on one line (``cropscale: warning: ...``)."""
    if issubclass(category, DataWarning):
        return f"cropscale: warning: {message}\n"
    return _FORMAT_WARNING(message, category, filename, lineno, line)


class CropScaleError(ValueError):
    """A user-facing error: bad input data, a bad argument or a bad configuration.

    The message names the file, patch or argument at fault. The CLI prints it as one paragraph
    (``cropscale: error: ...``) and exits with :attr:`exit_status` instead of showing a traceback.
    """

    exit_status: int = 2
    """Exit status of the command that ends with this error."""


class ConfigError(CropScaleError):
    """A bad command-line argument or configuration option; the message names the option."""


class TrainerArgumentError(ConfigError):
    """A ``--trainer.*`` value that Lightning's Trainer refused.

    The message is Lightning's, prefixed with the option when Lightning names it.
    """


class CheckpointError(CropScaleError):
    """A ``--ckpt_path`` that is missing, not a Lightning checkpoint, or holds weights of another network.

    The message names the path.
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
