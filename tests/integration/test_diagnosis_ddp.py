"""Faults injected into one rank of real two-process (gloo) fits: the diagnosis names that rank, not its victims.

Under DDP the slow rank's own work shows as waiting on the other rank (its exposed all-reduce), and both ranks'
steps are about as long; the diagnosis must name the rank whose own work explains the other's wait, and the part
of its step (issue 39). ``python -m cropscale fit`` of the real CropMappingNet at small width on the bundled
sample, 2 CPU processes, one fault each from a ``--config`` file; a clean run names no straggler.
Each run: 6 optimizer steps a rank and epoch (5 measured from epoch 1), under 90 s on an idle 2-core machine.
"""

from __future__ import annotations

import pytest

from tests.integration.test_diagnosis_faults import callbacks, fit, kinds

pytestmark = [pytest.mark.slow]

DDP = ["--data.samples_per_patch=12"]  # 24 crops at batch 2: 6 steps a rank and epoch


def test_a_clean_two_process_run_names_no_straggler(tmp_path, flanders_root):
    diag, lines, _ = fit(tmp_path, flanders_root, "clean2", None, *DDP, devices=2)
    assert diag.world_size == 2 and len(diag.ranks) == 2
    assert not [k for k, _ in kinds(diag) if k in ("straggler", "throttling")], lines


def test_a_slow_data_loader_on_rank_1_names_rank_1_and_its_data_wait(tmp_path, flanders_root):
    fault = callbacks("{class_path: cropscale.testing.faults.SlowDataLoader, init_args: {rank: 1, seconds: 0.3}}")
    diag, lines, _ = fit(tmp_path, flanders_root, "slow_data2", fault, *DDP, devices=2)
    lead = diag.findings[0]
    assert (lead.kind, lead.rank, lead.part) == ("straggler", 1, "data_wait"), lines
    assert "rank 1, in its data wait" in lines[0]
    victim, culprit = diag.ranks
    assert victim.wait_ms > culprit.wait_ms + 200 and culprit.own_ms > victim.own_ms + 200   # the 0.3 s sleep
    assert "input" not in [k for k, _ in kinds(diag)]      # rank 0's data wait is small: not the whole run's


def test_a_slow_backward_on_rank_1_names_rank_1_and_its_backward(tmp_path, flanders_root):
    fault = callbacks("{class_path: cropscale.testing.faults.SlowBackward, init_args: {rank: 1, seconds: 0.3}}")
    diag, lines, _ = fit(tmp_path, flanders_root, "slow_back2", fault, *DDP, devices=2)
    lead = diag.findings[0]
    assert (lead.kind, lead.rank, lead.part) == ("straggler", 1, "backward_own"), lines
    assert "communication" not in [k for k, _ in kinds(diag)]  # rank 0's wait is rank 1's backward, not the network


def test_a_rank_that_slows_from_epoch_2_is_named_against_its_own_best_epoch(tmp_path, flanders_root):
    fault = callbacks("{class_path: cropscale.testing.faults.RankSlowsDown,"
                      " init_args: {rank: 1, from_epoch: 2, seconds: 1.0}}")
    diag, lines, _ = fit(tmp_path, flanders_root, "slows2", fault, *DDP, devices=2, epochs=4)
    slowing = [(f.rank, f.part) for f in diag.findings if f.kind == "throttling"]
    assert slowing == [(1, "forward")], lines
    # rank 0 waits for rank 1 from epoch 2 on, but its own work stays: only rank 1's score falls
    assert diag.ranks[1].score < 0.7 and diag.ranks[1].score < 0.7 * diag.ranks[0].score
    assert diag.ranks[1].best_epoch == 1
