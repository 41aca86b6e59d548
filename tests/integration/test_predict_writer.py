"""``python -m cropscale predict --output DIR`` from a small trained CropMappingNet checkpoint on the bundled samples.

- worldcereal-flanders (EPSG:32631 patch polygons): one GeoTIFF per patch, opened with rasterio; its CRS and
  transform are checked against the patch polygon read from ``metadata.geojson`` here with ``json`` alone, its
  class map against the argmax of the network's logits computed here on the patch's two 32 x 32 halves
  (``--model.val_stride=32``: the tiles do not overlap, so the tiled logits are the halves' logits);
- pastis-r-mini (patch centres in lon/lat, no georeference): one ``.npz`` per patch, the class map against the
  network's logits on the whole 32 x 32 patch (one tile);
- the index lists every patch of the folds once; a non-empty or unwritable ``--output`` is refused, naming it;
- the command's last line says what it wrote and where (the count of class maps, their format, the folder);
- 2 gloo processes (slow): 5 patches, so one rank predicts a placeholder; each patch written once, by one rank.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cropscale.errors import CropScaleError
from cropscale.predictions import INDEX_NAME, NODATA, WrittenPatch, check_output_folder, written_line
from tests.integration.test_cli import run_cli

REPO = Path(__file__).resolve().parents[2]
SMALL_NET = {"s2_dim": 16, "s2_heads": 2, "s1_dim": 8, "s1_heads": 2, "width": 8, "fpn_dim": 16, "head_dim": 8,
             "decoder_dim": 8, "hr_dim": 4}
#: (data module arguments shared by training and predict, the predict folds)
FLANDERS = ({"t2": 4, "t1": 2}, [2])
PASTIS = ({"t2": 3, "t1": 3, "train_folds": [2], "val_folds": [3], "ignore_index": 19}, [3])


def _train_checkpoint(root: Path, data_kwargs: dict, path: Path) -> Path:
    """A few optimiser steps of the small CropMappingNet on the training fold, saved as a Lightning checkpoint."""
    import lightning.pytorch as pl

    from cropscale.data.datamodule import PastisHDDataModule
    from cropscale.model.task import CropMappingTask

    torch.manual_seed(0)
    dm = PastisHDDataModule(root=str(root), samples_per_patch=2, batch_size=2, **data_kwargs)
    task = CropMappingTask(num_classes=dm.num_classes, class_names=dm.class_names, ignore_index=dm.ignore_index,
                           net_kwargs=SMALL_NET, val_window=32, val_stride=32)
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, limit_val_batches=0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, datamodule=dm)
    trainer.save_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def flanders_ckpt(tmp_path_factory, flanders_root) -> Path:
    return _train_checkpoint(flanders_root, FLANDERS[0], tmp_path_factory.mktemp("ckpt") / "flanders.ckpt")


@pytest.fixture(scope="module")
def pastis_ckpt(tmp_path_factory, pastis_mini_root) -> Path:
    return _train_checkpoint(pastis_mini_root, PASTIS[0], tmp_path_factory.mktemp("ckpt") / "pastis.ckpt")


def _predict(cwd: Path, ckpt: Path, root: Path, data_kwargs: dict, folds: list[int], output: Path, *extra: str,
             timeout: int = 600):
    args = ["predict", f"--ckpt_path={ckpt}", f"--data.root={root}", f"--data.test_folds={folds}",
            "--model.val_stride=32", "--trainer.enable_progress_bar=false", f"--output={output}", *extra]
    args += [f"--data.{k}={json.dumps(v)}" for k, v in data_kwargs.items()]
    return run_cli(args, cwd=cwd, timeout=timeout, env_extra={"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})


def _metadata(root: Path) -> tuple[dict, dict[int, dict]]:
    """The collection and its features by patch id, read with ``json`` alone."""
    collection = json.loads((root / "metadata.geojson").read_text())
    return collection, {int(f["properties"]["ID_PATCH"]): f for f in collection["features"]}


def _fold_patches(root: Path, folds: list[int]) -> list[int]:
    return sorted(pid for pid, f in _metadata(root)[1].items() if f["properties"]["Fold"] in folds)


def _independent_class_map(ckpt: Path, root: Path, data_kwargs: dict, folds: list[int], patch_id: int) -> np.ndarray:
    """Argmax of the checkpoint's network over the patch, run on its 32-row bands (no overlap, no tiling code)."""
    from cropscale.batch import model_inputs
    from cropscale.data.collate import collate
    from cropscale.data.datamodule import PastisHDDataModule
    from cropscale.model.task import CropMappingTask

    task = CropMappingTask.load_from_checkpoint(ckpt, map_location="cpu").eval()
    dm = PastisHDDataModule(root=str(root), test_folds=folds, **data_kwargs)
    dm.setup("predict")
    ds = dm.test_dataset
    index = [p.patch_id for p in ds.patches].index(patch_id)
    inputs = model_inputs(collate([ds[index]], t1=dm.t1))
    h, w = ds.patches[index].hw
    assert w == 32 and h % 32 == 0
    bands = []
    with torch.no_grad():
        for top in range(0, h, 32):
            part = {k: v[..., top:top + 32, :] if v.dim() >= 3 and tuple(v.shape[-2:]) == (h, w) else v
                    for k, v in inputs.items()}
            bands.append(task.net(**part)["semantic"])
    return torch.cat(bands, dim=-2).argmax(dim=1)[0].numpy()


def _predicted(tmp_path: Path, ckpt: Path, root: Path, data_kwargs: dict, folds: list[int], *extra: str,
               timeout: int = 600) -> tuple[Path, dict]:
    """``predict --output tmp_path/maps``, which must succeed: the folder and its ``predictions.json``.

    The last line of its output says what it wrote and where: the count of maps and their format from the index.
    """
    output = tmp_path / "maps"
    res = _predict(tmp_path, ckpt, root, data_kwargs, folds, output, *extra, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    index = json.loads((output / INDEX_NAME).read_text())
    n, tif = len(index["patches"]), all(p["georeferenced"] for p in index["patches"])
    fmt = f"GeoTIFF, {index['patches'][0]['crs']}" if tif else ".npz, no georeference"
    assert res.stdout.splitlines()[-1] == (f"cropscale predict: wrote {n} class maps ({fmt}) and {INDEX_NAME} to "
                                           f"{output.resolve()}"), res.stdout[-2000:]
    return output, index


def test_predict_writes_georeferenced_geotiffs_from_a_trained_checkpoint(tmp_path, flanders_root, flanders_ckpt):
    import rasterio
    from rasterio.transform import Affine

    data_kwargs, folds = FLANDERS
    output, index = _predicted(tmp_path, flanders_ckpt, flanders_root, data_kwargs, folds)
    expected_ids = _fold_patches(flanders_root, folds)
    assert expected_ids == [1002, 2002]
    assert [p["patch_id"] for p in index["patches"]] == expected_ids  # every patch of the folds, once
    assert sorted(x.name for x in output.iterdir()) == sorted([INDEX_NAME, "PRED_1002.tif", "PRED_2002.tif"])
    collection, features = _metadata(flanders_root)
    assert collection["crs"]["properties"]["name"].endswith("EPSG::32631")
    for entry in index["patches"]:
        assert entry["georeferenced"] is True and entry["shape"] == [64, 32] and entry["crs"] == "EPSG:32631"
        ring = features[entry["patch_id"]]["geometry"]["coordinates"][0]
        left, top = min(x for x, _ in ring), max(y for _, y in ring)
        right, bottom = max(x for x, _ in ring), min(y for _, y in ring)
        assert (right - left, top - bottom) == (320, 640)  # 32 x 64 pixels of 10 m
        with rasterio.open(output / entry["file"]) as src:
            assert src.crs.to_epsg() == 32631
            assert src.transform == Affine(10.0, 0.0, left, 0.0, -10.0, top)
            assert (src.count, src.dtypes[0], src.shape, src.nodata) == (1, "uint8", (64, 32), NODATA)
            assert src.descriptions == ("class id",)
            assert json.loads(src.tags()["CLASS_NAMES"]) == index["class_names"]
            if entry["patch_id"] == 1002:
                written = src.read(1)
    expected = _independent_class_map(flanders_ckpt, flanders_root, data_kwargs, folds, 1002)
    assert len(np.unique(expected)) >= 2, "the model predicts one class: the comparison would not discriminate"
    np.testing.assert_array_equal(written, expected)


def test_predict_writes_npz_for_patches_without_georeference(tmp_path, pastis_mini_root, pastis_ckpt):
    data_kwargs, folds = PASTIS
    output, index = _predicted(tmp_path, pastis_ckpt, pastis_mini_root, data_kwargs, folds)
    assert [p["patch_id"] for p in index["patches"]] == _fold_patches(pastis_mini_root, folds) == [20213, 30336]
    names = json.loads((pastis_mini_root / "classes.json").read_text())
    assert index["class_names"] == [names[str(i)] for i in range(len(names))] and index["ignore_index"] == 19
    for entry in index["patches"]:
        assert (entry["georeferenced"], entry["crs"], entry["file"]) == (False, None, f"PRED_{entry['patch_id']}.npz")
        with np.load(output / entry["file"], allow_pickle=False) as npz:
            assert npz["semantic"].dtype == np.uint8 and npz["semantic"].shape == (32, 32)
            assert int(npz["patch_id"]) == entry["patch_id"] and int(npz["nodata"]) == NODATA
            expected = _independent_class_map(pastis_ckpt, pastis_mini_root, data_kwargs, folds, entry["patch_id"])
            np.testing.assert_array_equal(npz["semantic"], expected)


def test_predict_refuses_a_non_empty_output_folder_and_keeps_its_files(tmp_path, flanders_root, flanders_ckpt):
    output = tmp_path / "maps"
    output.mkdir()
    (output / "keep.txt").write_text("earlier work")
    res = _predict(tmp_path, flanders_ckpt, flanders_root, *FLANDERS, output)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == (
        f"cropscale: error: --output {output} is not empty (keep.txt): give a new or empty folder, so that no"
        " earlier prediction is overwritten or mixed with this run's")
    assert sorted(p.name for p in output.iterdir()) == ["keep.txt"]
    assert (output / "keep.txt").read_text() == "earlier work"


def test_check_output_folder(tmp_path):
    assert check_output_folder(tmp_path / "new" / "maps") == tmp_path / "new" / "maps"
    assert not (tmp_path / "new").exists()  # nothing created by the check
    (tmp_path / "empty").mkdir()
    check_output_folder(tmp_path / "empty")
    (tmp_path / "file").write_text("x")
    with pytest.raises(CropScaleError, match=f"--output {tmp_path / 'file'}: is a file"):
        check_output_folder(tmp_path / "file")
    with pytest.raises(CropScaleError, match=f"--output folder {tmp_path / 'file' / 'sub'} cannot be created"):
        check_output_folder(tmp_path / "file" / "sub")
    full = tmp_path / "full"
    full.mkdir()
    for i in range(5):
        (full / f"PRED_{i}.tif").write_text("x")
    with pytest.raises(CropScaleError, match=r"is not empty \(PRED_0.tif, PRED_1.tif, PRED_2.tif and 2 more\)"):
        check_output_folder(full)


@pytest.mark.slow
def test_predict_under_two_gloo_processes_writes_each_patch_once(tmp_path, pastis_mini_root, pastis_ckpt):
    data_kwargs, folds = dict(PASTIS[0]), [1, 3]  # 5 patches over 2 ranks: rank 1 also runs a placeholder
    output, index = _predicted(tmp_path, pastis_ckpt, pastis_mini_root, data_kwargs, folds, "--trainer.accelerator=cpu",
                               "--trainer.devices=2", "--trainer.strategy=ddp", timeout=900)
    expected = _fold_patches(pastis_mini_root, folds)
    assert len(expected) == 5
    assert [p["patch_id"] for p in index["patches"]] == expected
    ranks = [p["rank"] for p in index["patches"]]
    assert sorted(ranks) == [0, 0, 0, 1, 1] or sorted(ranks) == [0, 0, 1, 1, 1]  # ceil(5 / 2) = 3 steps each
    assert sorted(x.name for x in output.iterdir()) == sorted([INDEX_NAME, *(f"PRED_{i}.npz" for i in expected)])
    for pid in expected[:1]:
        with np.load(output / f"PRED_{pid}.npz") as npz:
            want = _independent_class_map(pastis_ckpt, pastis_mini_root, data_kwargs, folds, pid)
            np.testing.assert_array_equal(npz["semantic"], want)


def test_the_written_line_counts_each_format():
    def patch(pid, crs):
        return WrittenPatch(pid, f"PRED_{pid}.{'tif' if crs else 'npz'}", (32, 32), crs is not None, crs, 0)

    folder = Path("/data/maps")
    assert written_line([patch(1, "EPSG:2154")], folder) == \
        "cropscale predict: wrote 1 class map (GeoTIFF, EPSG:2154) and predictions.json to /data/maps"
    assert written_line([patch(1, "EPSG:2154"), patch(2, "EPSG:32631"), patch(3, None)], folder) == (
        "cropscale predict: wrote 3 class maps (2 GeoTIFF, EPSG:2154 and EPSG:32631; 1 .npz, no georeference)"
        " and predictions.json to /data/maps")
    assert written_line([], folder) == "cropscale predict: wrote 0 class maps and predictions.json to /data/maps"
