"""Shared fixtures: paths of the bundled real samples in ../shared/data (else data/, what `make data` links);
a real small file system."""

import logging
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
# ../shared/data beside the repository; in a checkout that has none beside it (a git worktree), data/ (make data)
SHARED_DATA = next((d for d in (REPO_ROOT.parent / "shared" / "data", REPO_ROOT / "data") if d.is_dir()),
                   REPO_ROOT.parent / "shared" / "data")
FLANDERS = SHARED_DATA / "worldcereal-flanders"
PASTIS_MINI = SHARED_DATA / "pastis-r-mini"
VHR_SAMPLE = SHARED_DATA / "vhr-samples" / "treesatai_aerial_0p2m.tif"


_LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")


@pytest.fixture(autouse=True)
def _process_settings_restored() -> Iterator[None]:
    """Process-wide settings that code under test may change, put back after every test: the TF32 switches
    (the task sets them at setup, the benchmark per configuration) and the Lightning loggers' levels (the benchmark
    commands silence them). A test that reads them (the MFU dtypes, a logged reason) then sees the defaults
    whatever ran before it."""
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    precision = torch.get_float32_matmul_precision()
    levels = {name: logging.getLogger(name).level for name in _LIGHTNING_LOGGERS}
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul
    torch.set_float32_matmul_precision(precision)
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@contextmanager
def tmpfs_mount(mnt: Path, size: str, why: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (mount(8) syntax, e.g. ``"40m"``) on the new folder ``mnt``; unmount at exit.

    Skips the test (``why`` says what for) when not root or when mount(8) fails.
    """
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip(f"needs root and mount(8) {why}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"bundled sample missing: {path} (expected ../shared/data beside the repository, or make data)")
    return path


@pytest.fixture(scope="session")
def flanders_root() -> Path:
    """Root of the bundled real sample (worldcereal-flanders, PASTIS-HD layout)."""
    return _require(FLANDERS)


@pytest.fixture(scope="session")
def pastis_mini_root() -> Path:
    """Root of the seven real PASTIS-R patches (pastis-r-mini)."""
    return _require(PASTIS_MINI)


@pytest.fixture(scope="session")
def vhr_sample() -> Path:
    """The real 0.2 m aerial GeoTIFF (EPSG:25832)."""
    return _require(VHR_SAMPLE)
