"""Fixtures shared by the data tests: a writable copy of the bundled Flanders sample."""

import pytest

from tests.data.test_errors import make_copy

FLANDERS_IDS = [1001, 1002, 2001, 2002]


@pytest.fixture
def flanders4(flanders_root, tmp_path):
    """A full copy of the Flanders sample (two training, two validation patches)."""
    return make_copy(flanders_root, tmp_path / "flanders", FLANDERS_IDS)
