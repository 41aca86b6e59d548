"""Atomic file writes (layer 0): neither a reader nor a process killed mid-write ever sees a truncated file.

A reader sees the previous complete file or the new complete file.

The new content goes to a temporary file in the same folder (same file system), is flushed and
``fsync``-ed, then renamed over the target with :func:`os.replace` (atomic on POSIX and Windows).

Also the one lookup of the checkout's files (:func:`find_resource`): ``configs/``, the bundled sample.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from cropscale.errors import CropScaleError


def atomic_write(path: str | os.PathLike, write: Callable[[IO[Any]], None], *, binary: bool = False) -> Path:
    """Write ``path`` atomically: ``write(f)`` fills a temporary file that then replaces ``path``.

    Args:
        path: the target file; its folder is created if needed.
        write: called once with the open temporary file.
        binary: open the temporary file in binary mode (else text, UTF-8).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        CropScaleError: the folder cannot be created or written, or ``path`` is a folder (the
            message names the path); the previous file is left as it was.
    """
    target = Path(path)
    if target.is_dir():
        raise CropScaleError(f"cannot write {target}: it is a folder")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as err:
        raise CropScaleError(f"cannot write {target}: {err.strerror or err}") from None
    try:
        os.chmod(tmp, _file_mode(target))  # mkstemp's 0600 would hide the file from the user's group
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as err:
        _remove(tmp)
        raise CropScaleError(f"cannot write {target}: {err.strerror or err}") from None
    except BaseException:
        _remove(tmp)
        raise
    return target


def _file_mode(target: Path) -> int:
    """The permission bits of the existing ``target``, else those ``open()`` would give: 0666 minus the umask."""
    try:
        return target.stat().st_mode & 0o7777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def check_writable_folder(path: str | os.PathLike, what: str = "folder") -> Path:
    """Check that files can be created in ``path`` (or, while it does not exist, in its nearest existing parent).

    The check creates and removes a temporary file there, so it also catches read-only mounts, which
    ``os.access`` does not see for root.

    Args:
        path: the folder that will be written (it need not exist yet).
        what: how the message calls it (``run folder``, ``statistics folder`` ...).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        CropScaleError: naming ``path``: it, or its nearest existing parent, is a file or cannot be written.
    """
    folder = Path(path)
    probe = folder
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise CropScaleError(f"{what} {folder} cannot be created: {probe} is a file")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".cropscale-write-check.", dir=probe)
    except OSError as err:
        where = "" if probe == folder else f" ({probe}, where it would be created)"
        raise CropScaleError(f"{what} {folder} is not writable{where}: {err.strerror or err}") from None
    os.close(fd)
    _remove(tmp)
    return folder


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda f: f.write(text))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2, default: Any = None,
                      allow_nan: bool = False) -> Path:
    """Write ``obj`` as JSON atomically (see :func:`atomic_write`); ``default`` as in :func:`json.dump`.

    Raises:
        CropScaleError: as :func:`atomic_write`.
        ValueError: NaN or inf in ``obj`` while ``allow_nan`` is False (JSON has no NaN); the previous
            file is left as it was.
    """
    def write(f: IO[str]) -> None:
        json.dump(obj, f, indent=indent, default=default, allow_nan=allow_nan)
        f.write("\n")

    return atomic_write(path, write)


# ------------------------------------------------------------------------------ the checkout's files
CHECKOUT = Path(__file__).resolve().parents[1]
"""The source checkout the package is imported from (``configs/``, ``callbacks/``, ``data/`` beside ``cropscale/``)."""
DEFAULT_CONFIG = CHECKOUT / "configs" / "default.yaml"
"""The configuration every Lightning subcommand reads first."""
SAMPLE_DATA = "data/worldcereal-flanders"
"""The bundled real sample: ``make data`` links it into the checkout; the tests read it from ``../shared``."""


def resource_places(relative: str | os.PathLike, *, cwd: bool = True) -> list[Path]:
    """Where a file of the checkout may be, in the order looked at.

    ``relative`` itself when absolute; else under the working directory (with ``cwd``), the checkout
    (:data:`CHECKOUT`) and the ``shared`` folder beside it (where the bundled sample lives for the tests).
    """
    path = Path(relative).expanduser()
    if path.is_absolute():
        return [path]
    return ([Path.cwd() / path] if cwd else []) + [CHECKOUT / path, CHECKOUT.parent / "shared" / path]


def find_resource(relative: str | os.PathLike, what: str, *, cwd: bool = True, holding: str = "",
                  hint: str = "") -> Path:
    """The first of :func:`resource_places` that exists (and holds the file ``holding``), resolved.

    Args:
        relative: the path as given (``configs/precision/fp32.yaml``, :data:`SAMPLE_DATA`, an absolute path).
        what: what it is, for the error (``precision config``, ``data root``).
        cwd: look under the working directory first.
        holding: a file the folder must hold to count (``metadata.geojson`` for a dataset root).
        hint: what to do, appended to the error.

    Raises:
        CropScaleError: found nowhere (every place tried is named, with ``hint``).
    """
    places = resource_places(relative, cwd=cwd)
    for place in places:
        if (place / holding).exists() if holding else place.exists():
            return place.resolve()
    tried = " or ".join(str(p / holding) if holding else str(p) for p in places)
    raise CropScaleError(f"{what} not found: {relative} (tried {tried}){'; ' + hint if hint else ''}")
