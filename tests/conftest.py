"""Shared fixtures: paths of the bundled real samples in ../shared/data."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
FLANDERS = SHARED_DATA / "worldcereal-flanders"
PASTIS_MINI = SHARED_DATA / "pastis-r-mini"
VHR_SAMPLE = SHARED_DATA / "vhr-samples" / "treesatai_aerial_0p2m.tif"


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"bundled sample missing: {path} (expected ../shared/data beside the repository)")
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
