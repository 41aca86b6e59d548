"""A rank that hangs is named: the hang watch of a DDP fit (issue 39).

- :mod:`cropscale.hangs.judge`: the decision, framework-free: each rank's :class:`Progress`, the bound
  (:class:`HangBound`) and :class:`HangJudge`, which names the hung rank;
- :mod:`cropscale.hangs.watch`: :class:`HangWatch`, the callback whose threads carry the ranks' progress through
  the run's TCP store to rank 0 and end the run;
- :mod:`cropscale.hangs.recorder`: PyTorch's Flight Recorder turned on for NCCL, its dumps in the run folder.

``docs/run_json.md`` ("hang_watch") documents the record; the injector is
:class:`cropscale.testing.faults.HangAt`.
"""

from cropscale.hangs.judge import Hang, HangBound, HangJudge, Progress
from cropscale.hangs.recorder import prepare_flight_recorder
from cropscale.hangs.watch import HANG_EXIT_STATUS, HangWatch, RankHang, ending, wait_while_ending, watch_of

__all__ = ["HANG_EXIT_STATUS", "Hang", "HangBound", "HangJudge", "HangWatch", "Progress", "RankHang", "ending",
           "prepare_flight_recorder", "wait_while_ending", "watch_of"]
