"""Validation on 1 process and on 2 CPU processes (DDP, gloo) gives the same metrics.

Three real PASTIS-R patches (pastis-r-mini, fold 1) are validated by a tiny deterministic
LightningModule (a fixed 1x1 convolution of the inputs; its prediction is a fixed function of the
input) with tiled inference, :class:`~cropscale.data.sharding.EvalShardSampler` and the summed-state
metrics of :mod:`cropscale.metrics`. 3 patches on 2 ranks: rank 0 validates 2 patches, rank 1 one.

Launch: the 1-process run is a Trainer in the test process. For 2 processes this file is also a script
(``python tests/test_val_ddp.py --devices 2 --data ... --out ...``), run by the test in a subprocess with
``strategy="ddp"`` (gloo on CPU). Lightning's DDP launcher re-executes
``sys.argv`` for the other ranks, which would re-run pytest if the Trainer ran inside pytest; running the
script in a subprocess re-executes the script instead, keeps the process group out of the pytest
process, and is the launcher real runs use. (``ddp_spawn`` would need the module and data pickled into
spawned interpreters, which are as slow to start.) Rank 0 writes the computed metrics to a JSON file
and every rank the patch ids it validated; the test compares them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
NUM_CLASSES, VOID = 20, 19  # PASTIS nomenclature: 0 background, 1..18 crops, 19 void (ignored)
HR = 2  # high-grid ratio of the stand-in model (small to keep the test fast)


def load_fold(root: Path, fold: int = 1) -> list[dict[str, torch.Tensor]]:
    """The patches of ``fold`` as model inputs + targets, read with numpy (PASTIS layout)."""
    meta = json.loads((root / "metadata.geojson").read_text())
    ids = sorted(int(f["properties"]["ID_PATCH"]) for f in meta["features"] if int(f["properties"]["Fold"]) == fold)
    raw = {pid: {m: np.load(root / f"DATA_{m}" / f"{m}_{pid}.npy").astype(np.float32) for m in ("S2", "S1A", "S1D")}
           for pid in ids}
    # per-band mean and standard deviation over the fold (as the data module normalises with training-fold
    # statistics): a fixed function of the data, the same in every process
    stats = {m: (np.stack([raw[p][m] for p in ids]).mean(axis=(0, 1, 3, 4))[:, None, None],
                 np.stack([raw[p][m] for p in ids]).std(axis=(0, 1, 3, 4))[:, None, None] + 1e-6)
             for m in ("S2", "S1A", "S1D")}
    samples = []
    for pid in ids:
        s2, s1a, s1d = ((raw[pid][m] - stats[m][0]) / stats[m][1] for m in ("S2", "S1A", "S1D"))
        s1a, s1d = s1a[:, :2], s1d[:, :2]  # VV, VH (dB)
        semantic = np.load(root / "ANNOTATIONS" / f"TARGET_{pid}.npy")[0].astype(np.int64)
        inst = np.load(root / "INSTANCE_ANNOTATIONS" / f"INSTANCES_{pid}.npy")
        pad = np.pad(inst, 1, mode="edge")
        h, w = inst.shape
        boundary = np.zeros((h, w), dtype=bool)
        for dy, dx in ((0, 1), (2, 1), (1, 0), (1, 2)):
            boundary |= pad[dy:dy + h, dx:dx + w] != inst
        parcel = np.stack([inst > 0, boundary, np.zeros_like(boundary)]).astype(np.float32)
        rgb = np.clip(raw[pid]["S2"][:, [2, 1, 0]].mean(0) / 3000.0, 0.0, 1.0)  # derived high-grid target
        hr = rgb.repeat(HR, axis=1).repeat(HR, axis=2)
        t2, t1 = s2.shape[0], s1a.shape[0]
        samples.append({
            "s2": torch.from_numpy(np.ascontiguousarray(s2)), "s2_doy": torch.arange(1, t2 + 1) * 30,
            "s2_mask": torch.ones(t2, h, w, dtype=torch.bool),
            "s1a": torch.from_numpy(np.ascontiguousarray(s1a)), "s1a_doy": torch.arange(1, t1 + 1) * 30,
            "s1a_mask": torch.ones(t1, dtype=torch.bool),
            "s1d": torch.from_numpy(np.ascontiguousarray(s1d)), "s1d_doy": torch.arange(1, t1 + 1) * 30,
            "s1d_mask": torch.ones(t1, dtype=torch.bool),
            "semantic": torch.from_numpy(semantic), "parcel": torch.from_numpy(parcel),
            "parcel_present": torch.tensor(True), "hr": torch.from_numpy(np.ascontiguousarray(hr)),
            "hr_present": torch.tensor(True), "patch_id": torch.tensor(pid),
        })
    return samples


class FixedNet(torch.nn.Module):
    """A fixed 1x1 convolution of the time means of S2 and both S1 orbits (seeded weights)."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1234)
        self.conv = torch.nn.Conv2d(14, NUM_CLASSES + 3 + 3, kernel_size=1)
        with torch.no_grad():
            self.conv.weight.copy_(torch.randn(self.conv.weight.shape, generator=g))
            self.conv.bias.copy_(0.1 * torch.randn(self.conv.bias.shape, generator=g))

    def forward(self, s2, s2_doy, s2_mask, s1a, s1a_doy, s1a_mask, s1d, s1d_doy, s1d_mask):
        x = torch.cat([s2.mean(1), s1a.mean(1), s1d.mean(1)], dim=1)
        y = self.conv(x)
        hr = torch.sigmoid(torch.nn.functional.interpolate(y[:, -3:], scale_factor=HR, mode="nearest"))
        return {"semantic": y[:, :NUM_CLASSES], "parcel": y[:, NUM_CLASSES:NUM_CLASSES + 3], "hr": hr}


def validate_batch(net, batch, seg, parcel, high):
    from cropscale.batch import model_inputs
    from cropscale.tiling import sliding_window_inference

    out = sliding_window_inference(net, model_inputs(batch), window=16, stride=8, hr_scale=HR, tile_batch_size=4)
    seg.update(out["semantic"], batch["semantic"])
    parcel.update(out["parcel"], batch["parcel"], batch["parcel_present"])
    high.update(out["hr"], batch["hr"], batch["hr_present"])


def metric_record(seg, parcel, high) -> dict:
    s, p, h = seg.compute(), parcel.compute(), high.compute()
    return {"confusion_matrix": s["confusion_matrix"].tolist(), "mIoU": float(s["mIoU"]), "OA": float(s["OA"]),
            # (the states read after compute() are this rank's again: use compute()'s results)
            "boundary": [float(p[k]) for k in ("boundary_precision", "boundary_recall", "boundary_F1")],
            "hr_L1": float(h["hr_L1"]), "hr_PSNR": float(h["hr_PSNR"])}


def _new_metrics():
    from cropscale.metrics import HighGridMetrics, ParcelMetrics, SegmentationMetrics

    return SegmentationMetrics(NUM_CLASSES, ignore_index=VOID), ParcelMetrics(tolerance=1), HighGridMetrics()


def run_validation(devices: int, data: Path, out: Path) -> None:
    """Validate the fold-1 patches with a Lightning Trainer on ``devices`` CPU processes."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    from cropscale.data.sharding import EvalShardSampler
    from cropscale.distributed import finish_distributed

    torch.set_num_threads(1)

    class TinyValModule(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = FixedNet()
            self.seg, self.parcel, self.high = _new_metrics()
            self.seen: list[int] = []

        def val_dataloader(self):
            samples = load_fold(data)
            return DataLoader(samples, batch_size=1, sampler=EvalShardSampler(len(samples)))

        def validation_step(self, batch, batch_idx):
            self.seen.extend(int(i) for i in batch["patch_id"])
            validate_batch(self.net, batch, self.seg, self.parcel, self.high)

        def on_validation_epoch_end(self):
            record = metric_record(self.seg, self.parcel, self.high)  # compute() sums states over ranks
            (out / f"rank{self.global_rank}_patches.json").write_text(json.dumps(self.seen))
            if self.trainer.is_global_zero:
                record["world_size"] = self.trainer.world_size
                (out / "metrics.json").write_text(json.dumps(record))

    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.validate(TinyValModule())
    # as cropscale's CLI does: destroy the gloo group (left to interpreter exit it can abort) and let rank 0
    # return only after rank 1 has written its files and exited 0
    assert finish_distributed(trainer) == []


def _run_script(devices: int, data: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, __file__, "--devices", str(devices), "--data", str(data), "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.filterwarnings("ignore:.*LeafSpec")  # Lightning 2.6 on torch 2.13
def test_validation_on_one_and_two_processes_gives_the_same_metrics(pastis_mini_root, tmp_path):
    torch.set_num_threads(1)
    # reference without Lightning: the three patches in one process
    net, (seg, parcel, high) = FixedNet(), _new_metrics()
    samples = load_fold(pastis_mini_root)
    assert [int(s["patch_id"]) for s in samples] == [10186, 10477, 30012]
    with torch.no_grad():
        for s in samples:
            validate_batch(net, {k: v[None] for k, v in s.items()}, seg, parcel, high)
    ref = metric_record(seg, parcel, high)
    labelled = sum(int(((s["semantic"] != VOID)).sum()) for s in samples)
    assert sum(map(sum, ref["confusion_matrix"])) == labelled  # every labelled pixel once
    assert 0.0 < ref["mIoU"] < 1.0 and all(0.0 < v < 1.0 for v in ref["boundary"])

    (tmp_path / "one").mkdir()
    run_validation(1, pastis_mini_root, tmp_path / "one")  # one process: no launcher, run it here
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    two = _run_script(2, pastis_mini_root, tmp_path / "two")
    assert (one["world_size"], two["world_size"]) == (1, 2)
    # every patch exactly once: rank 0 validated patches 0 and 2, rank 1 patch 1
    assert json.loads((tmp_path / "two" / "rank0_patches.json").read_text()) == [10186, 30012]
    assert json.loads((tmp_path / "two" / "rank1_patches.json").read_text()) == [10477]
    for run in (one, two):
        assert run["confusion_matrix"] == ref["confusion_matrix"]
        assert run["mIoU"] == ref["mIoU"] and run["OA"] == ref["OA"]
        assert run["boundary"] == ref["boundary"]  # ratios of integer counts: exact
        assert run["hr_L1"] == pytest.approx(ref["hr_L1"], rel=1e-12)
        assert run["hr_PSNR"] == pytest.approx(ref["hr_PSNR"], rel=1e-12)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    run_validation(args.devices, args.data, args.out)
