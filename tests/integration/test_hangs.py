"""A rank that hangs is named (issue 39): ``python -m cropscale fit`` of the tiny CropMappingNet on the bundled
sample, 2 gloo processes, one rank hanging from epoch 1 on (:class:`cropscale.testing.faults.HangAt`).

Each variant: rank 0 names the hung rank once no rank has moved for the bound (and at most two polls later),
prints one last line with every rank's last progress and the resume command, exits with status 1, leaves
the hang in ``run.json`` and no process behind. The rank-1 collective variant also runs with gloo's Flight
Recorder on (``TORCH_FR_BUFFER_SIZE``, the user's): both ranks' dumps show the all-reduce rank 1 entered alone.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_cli import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*LeafSpec")]

REPO = Path(__file__).resolve().parents[2]
#: 2 training patches x 3 crops, batch 2 on 2 ranks: 2 steps per epoch; 4 dates; the tiny network
SMALL = ["--data.samples_per_patch=3", "--data.batch_size=2", "--data.t2=4", "--data.t1=2",
         "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", "--trainer.max_epochs=3",
         "--model.net_kwargs={s2_dim: 16, s2_heads: 2, s1_dim: 8, width: 8, fpn_dim: 16, head_dim: 8,"
         " decoder_dim: 8, hr_dim: 4}"]
DDP = ["--trainer.accelerator=cpu", "--trainer.devices=2", "--trainer.strategy=ddp"]
#: the watch of the test: a 4-s floor, 3 x the longest ordinary stillness, polled 4 times a second
FLOOR_S, FACTOR, POLL_S = 4.0, 3.0, 0.25
WATCH = ["--trainer.callbacks+=cropscale.hangs.HangWatch", f"--trainer.callbacks.floor_s={FLOOR_S}",
         f"--trainer.callbacks.factor={FACTOR}", f"--trainer.callbacks.poll_s={POLL_S}",
         "--trainer.callbacks.pause_floor_s=60"]


def _hang_at(rank: int, where: str) -> list[str]:
    return ["--trainer.callbacks+=cropscale.testing.faults.HangAt", "--trainer.callbacks.epoch=1",
            "--trainer.callbacks.batch=0", f"--trainer.callbacks.rank={rank}", f"--trainer.callbacks.where={where}"]


@pytest.mark.parametrize("rank,where,recorder", [(1, "own-code", False), (1, "collective", True),
                                                 (0, "own-code", False)])
def test_a_hanging_rank_is_named_within_the_bound_and_the_run_ends_resumable(tmp_path, flanders_root, rank, where,
                                                                           recorder):
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    if recorder:
        env["TORCH_FR_BUFFER_SIZE"] = "200"
    res = run_cli(["fit", f"--data.root={flanders_root}", *SMALL, *DDP, *WATCH, *_hang_at(rank, where)],
                  cwd=tmp_path, timeout=180, env_extra=env)
    # status 1: the run failed (not 2, a user error; not 0, a stop that saved a checkpoint at its step)
    assert res.returncode == 1, res.stderr[-3000:]
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith(f"cropscale: error: DDP rank {rank} hangs: no rank has reached its next step for "), line
    # epoch 0 ended at global step 2 with last.ckpt; the resume command is the run's, with --ckpt_path auto
    assert ("; no checkpoint was saved at the hang, the newest is runs/default/version_0/checkpoints/last.ckpt"
            " (epoch 0, global step 2); resume with: python -m cropscale fit --data.root=") in line
    assert line.endswith(" --ckpt_path auto") and "Traceback" not in res.stderr

    hang_line = re.search(r"HangAt: rank (\d) \(pid (\d+)\) hangs .* unix time ([\d.]+)", res.stderr)
    assert hang_line is not None and int(hang_line.group(1)) == rank
    hung_pid, hung_at = int(hang_line.group(2)), float(hang_line.group(3))

    record = json.loads((tmp_path / "runs" / "default" / "version_0" / "run.json").read_text())
    assert record["status"] == "failed" and record["error"]["type"] == "RankHang"
    watch = record["hang_watch"]
    assert (watch["enabled"], watch["floor_s"], watch["factor"], watch["poll_s"]) == (True, FLOOR_S, FACTOR, POLL_S)
    hang = watch["hang"]
    assert hang["hung_ranks"] == [rank] and hang["separated"] and hang["bound_kind"] == "step"
    assert line.startswith(f"cropscale: error: {hang['message']}; no checkpoint was saved at the hang")
    # the bound: max(floor, factor x the longest ordinary stillness) as its rule states it, named within two polls
    learned = float(re.fullmatch(rf"max\(floor {FLOOR_S:g} s, {FACTOR:g} x ([\d.e+-]+) s, the longest stillness of"
                                 r" ordinary steps so far\)", hang["bound_rule"]).group(1))
    assert hang["bound_s"] == pytest.approx(max(FLOOR_S, FACTOR * learned), rel=5e-3)
    assert hang["bound_s"] <= hang["still_s"] <= hang["bound_s"] + 2 * POLL_S
    detected = datetime.datetime.fromisoformat(hang["detected_utc"]).timestamp()
    # the run stood still only after the hang began, and the other rank stopped within a step or so of it
    assert hang["still_s"] <= detected - hung_at <= hang["still_s"] + 20

    hung, other = hang["ranks"][rank], hang["ranks"][1 - rank]
    assert (hung["epoch"], hung["batch"], hung["stage"], hung["global_step"], hung["phase"]) == (
        1, 0, "after its step", 3, "training")  # in on_train_batch_end of epoch 1's first batch
    assert hung["in_collective"] is (where == "collective") and hung["heartbeat"]
    assert hung["where"].startswith("in a collective: all_reduce, called from cropscale/testing/faults.py:"
                                    if where == "collective" else "in its own code at cropscale/testing/faults.py:")
    assert hung["where"].endswith(" in on_train_batch_end")
    assert other["in_collective"] is True and (other["epoch"], other["global_step"]) == (1, 3)
    assert other["stage"] != "after its step"  # it went on to the next collective

    if recorder:
        _check_flight_recorder(watch, tmp_path / "runs" / "default" / "version_0")
    else:
        assert watch["flight_recorder"]["applies"] is False and hang["flight_recorder_dumps"] == []

    # no process left behind: the hung rank and every other process of this run are gone
    with pytest.raises(ProcessLookupError):
        os.kill(hung_pid, 0)
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert leftover == [], "a rank still runs"


def _check_flight_recorder(watch: dict, run: Path) -> None:
    """Rank 1 entered an all-reduce on a group of its own that rank 0 never entered; rank 0 waits in the default
    group's collectives that rank 1 never entered (a completed collective is retired)."""
    fr = watch["flight_recorder"]
    assert (fr["applies"], fr["backend"], fr["trace_buffer_size"], fr["set_by"]) == (True, "gloo", 200,
                                                                                       "cropscale and user")
    prefix = str(run.resolve() / "flight_recorder" / "trace_rank_")
    assert fr["dump_prefix"] == prefix and watch["hang"]["flight_recorder_dumps"] == [f"{prefix}0", f"{prefix}1"]
    dumps = [pickle.loads(Path(f"{prefix}{r}").read_bytes())["entries"] for r in (0, 1)]
    pending = [[(e["profiling_name"], e["process_group"][1]) for e in entries if not e["retired"]] for entries in dumps]
    assert pending[1] == [("gloo:all_reduce", "undefined")]  # HangAt's group, entered by rank 1 alone
    assert pending[0] and all(group == "default_pg" for _, group in pending[0])
    assert not any(name == "gloo:all_reduce" and group == "undefined" for name, group in
                   ((e["profiling_name"], e["process_group"][1]) for e in dumps[0]))
