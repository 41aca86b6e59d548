"""Device values read on the host in one batch: one device-to-host copy for every callback of a log step.

A callback hands :func:`read_later` the device tensors it needs on the host (0-d ``scalars`` and 1-D
``vectors``) and a function to call with their values. Outside a batch the values are read at once (one copy
per call). Inside one (:func:`open_reads` ... :func:`close_reads`, what
:class:`~cropscale.callbacks.CallbackGroup` does around ``on_train_batch_end``) every request waits for the
end of the batch, where all the tensors are joined into one tensor (one ``torch.stack`` of the scalars, one
``torch.cat`` with the vectors) and copied to the host with one ``tolist()``: one device-to-host read per log
step for the whole group (one synchronisation on a GPU). Each function then gets its values: its scalars'
in order, then its vectors'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Request = tuple[Sequence[torch.Tensor], Callable[[list[float]], None], Sequence[torch.Tensor]]

_OPEN: list[list[Request]] = []  # open batches, innermost last


def read_values(scalars: Sequence[torch.Tensor], vectors: Sequence[torch.Tensor] = ()) -> list[float]:
    """The values of the 0-d ``scalars`` then of the 1-D ``vectors``, as host numbers: one device-to-host copy.

    Dtypes are promoted (integers and bools come back as numbers of the common type). Tensors on several
    devices, or not 0-d / 1-D, take a slower path (each flattened and moved to the first one's device).
    """
    if not scalars and not vectors:
        return []
    try:
        parts = ([torch.stack(list(scalars))] if scalars else []) + list(vectors)
        joined = parts[0] if len(parts) == 1 else torch.cat(parts)
        if joined.dim() != 1:
            raise RuntimeError("not 0-d scalars and 1-D vectors")
    except RuntimeError:
        device = (scalars or vectors)[0].device
        joined = torch.cat([t.detach().reshape(-1).to(device, torch.float64) for t in [*scalars, *vectors]])
    return joined.tolist()


def read_later(scalars: Sequence[torch.Tensor], then: Callable[[list[float]], None],
               vectors: Sequence[torch.Tensor] = ()) -> None:
    """Call ``then(values)`` with the host values of ``scalars`` and ``vectors`` (:func:`read_values`).

    Inside an open batch the call waits for :func:`close_reads`; outside one it happens now (one read).
    """
    if _OPEN:
        _OPEN[-1].append((scalars, then, vectors))
    else:
        then(read_values(scalars, vectors))


def open_reads() -> None:
    """Start a batch of reads: :func:`read_later` calls wait for the matching :func:`close_reads`."""
    _OPEN.append([])


def close_reads() -> None:
    """Read every tensor requested since the matching :func:`open_reads` in one copy and call the requesters.

    Each requester gets its own values, in the order of the requests; a requester that raises does not stop
    the others (the first error is raised once all ran).
    """
    requests = _OPEN.pop()
    if not requests:
        return
    scalars: list[torch.Tensor] = []
    vectors: list[torch.Tensor] = []
    for s, _, v in requests:
        scalars += s
        vectors += v
    host = read_values(scalars, vectors)
    error: BaseException | None = None
    i, j = 0, len(scalars)
    for s, then, v in requests:
        n = sum(t.numel() for t in v) if v else 0
        try:
            then(host[i:i + len(s)] + host[j:j + n])
        except Exception as exc:  # noqa: BLE001 - raised below, after every requester ran
            error = error or exc
        i += len(s)
        j += n
    if error is not None:
        raise error
