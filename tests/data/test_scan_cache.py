"""The data checks' cache (cropscale.data.scans): keyed by each file's size and modification time, outside the data
folder, written atomically so that processes scanning at once (DDP ranks) leave whole entries."""

import json
import multiprocessing
import os

import numpy as np
import pytest

from cropscale.data.datamodule import PastisHDDataModule
from cropscale.data.scans import ScanCache, default_cache_dir
from tests.data.test_errors import raises_naming


def _dm(root, cache, **kw):
    return PastisHDDataModule(str(root), t2=8, t1=2, s1_orbits=["S1A"], cache_dir=str(cache), **kw)


def _tree(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_size) for p in folder.rglob("*"))


def test_the_default_cache_is_outside_the_data_folder(flanders4, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "cropscale" / "data-scans"
    before = _tree(flanders4)
    dm = PastisHDDataModule(str(flanders4), t2=8, t1=2)
    dm.setup("fit")
    assert _tree(flanders4) == before  # nothing written beside the data
    entries = list((tmp_path / "xdg" / "cropscale" / "data-scans").glob("*.json"))
    assert len(entries) == 4 and dm.scan_cache.misses == 4  # one per patch: 2 training, 2 validation


def test_a_second_run_hits_and_a_rewritten_file_is_scanned_again(flanders4, tmp_path):
    cache = tmp_path / "cache"
    _dm(flanders4, cache).setup("fit")
    dm = _dm(flanders4, cache)
    dm.setup("fit")
    assert (dm.scan_cache.hits, dm.scan_cache.misses) == (4, 0)
    path = flanders4 / "DATA_S1A" / "S1A_1002.npy"
    a = np.load(path)
    a[57] = 10.0 ** (a[57] / 10.0)  # linear power on one date: same size, a new modification time
    size = path.stat().st_size
    np.save(path, a)
    assert path.stat().st_size == size
    with raises_naming("patch 1002", path, "date index 57", "linear power"):
        _dm(flanders4, cache).setup("fit")
    dm = _dm(flanders4, cache)
    with pytest.raises(Exception, match="date index 57"):
        dm.setup("fit")
    # 1001, 2001, 2002 from the cache; 1002 scanned again (an error is not cached)
    assert (dm.scan_cache.hits, dm.scan_cache.misses) == (3, 1)


def test_a_cached_scan_gives_the_same_statistics_and_warnings(flanders4, tmp_path):
    cache = tmp_path / "cache"
    first = _dm(flanders4, cache)
    first.setup("fit")
    again = _dm(flanders4, cache)
    again.setup("fit")
    assert again.scan_cache.hits == 4
    np.testing.assert_array_equal(again.stats.s2_mean, first.stats.s2_mean)
    np.testing.assert_array_equal(again.stats.s1["S1A"][1], first.stats.s1["S1A"][1])
    assert again.stats.counts == first.stats.counts and again.data_warnings == first.data_warnings


def test_an_unwritable_default_cache_is_one_warning_and_the_run_goes_on(flanders4, tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    dm = PastisHDDataModule(str(flanders4), t2=8, t1=2, s1_orbits=["S1A"])
    with pytest.warns(UserWarning, match="data scan cache: .*every run checks the data again"):
        dm.setup("fit")
    assert dm.stats is not None and dm.scan_cache.problem is not None


def test_an_unwritable_cache_dir_given_is_refused_at_construction(flanders4, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with raises_naming("data.cache_dir", str(blocker)):
        _dm(flanders4, blocker / "cache")


def _scan_in_child(root, cache, start, out):
    start.wait()
    dm = _dm(root, cache)
    dm.setup("fit")
    out.put((dm.scan_cache.misses, dm.stats.s2_mean.tolist()))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_processes_scanning_at_once_leave_whole_entries(flanders4, tmp_path):
    """As DDP ranks do: each process scans and writes the same entries at the same time."""
    cache = tmp_path / "cache"
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=_scan_in_child, args=(flanders4, cache, start, out)) for _ in range(3)]
    for child in children:
        child.start()
    start.set()
    results = [out.get(timeout=300) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert all(r[1] == results[0][1] for r in results)
    entries = sorted(os.listdir(cache))
    assert len(entries) == 4 and all(e.endswith(".json") for e in entries)  # no temporary file left
    for e in entries:
        assert json.loads((cache / e).read_text())["checked"] is True
    dm = _dm(flanders4, cache)
    dm.setup("fit")
    assert dm.scan_cache.hits == 4


def test_the_key_follows_size_and_modification_time(flanders4, tmp_path):
    dm = _dm(flanders4, tmp_path / "cache")
    dm.setup("fit")
    p = dm.train_dataset.patches[0]
    cache = ScanCache(tmp_path / "cache")
    settings = {"a": 1}
    key = cache.key(p, settings)
    assert cache.key(p, settings) == key and cache.key(p, {"a": 2}) != key
    st = p.s2.stat()
    os.utime(p.s2, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert cache.key(p, settings) != key
    os.utime(p.s2, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.key(p, settings) == key  # the documented limit: content changed with size and time restored


def test_threads_give_the_same_scans_and_the_first_error_in_patch_order(flanders4):
    from cropscale.data.dataset import PastisHDDataset
    from cropscale.data.scans import scan_patches

    ds = PastisHDDataset(flanders4, None, train=False, s1_orbits=["S1A"])
    assert [p.patch_id for p in ds.patches] == [1001, 1002, 2001, 2002]
    one = scan_patches(ds.patches, num_classes=ds.num_classes, ignore_index=None, threads=1)
    two = scan_patches(ds.patches, num_classes=ds.num_classes, ignore_index=None, threads=3)
    assert [s.to_dict() for s in one] == [s.to_dict() for s in two]
    for pid, date in ((2002, 5), (1002, 70)):  # both bad; 1002 comes first in the metadata
        path = flanders4 / "DATA_S1A" / f"S1A_{pid}.npy"
        a = np.load(path)
        a[date] = 10.0 ** (a[date] / 10.0)
        np.save(path, a)
    with raises_naming("patch 1002", "date index 70"):
        scan_patches(ds.patches, num_classes=ds.num_classes, ignore_index=None, threads=3)
