"""Atomic writes: a process SIGKILLed while ``run.json``, the normalisation statistics or a study table is
being written leaves the previous complete file, never a truncated one.

Each writer runs in a child process that writes its file once (the previous version), then writes it again
with ``os.fsync`` replaced by a SIGKILL of the process: the kill lands after the new bytes went to the
temporary file and before the rename, the last moment a non-atomic writer could have left a torn file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_KILL_AT_FSYNC = """
import os, signal, sys
import cropscale.files as files
def kill(fd):
    os.kill(os.getpid(), signal.SIGKILL)
"""

WRITERS = {
    # run.json through ProvenanceCallback's own write
    "run.json": """
from cropscale.callbacks.provenance import ProvenanceCallback
class Record:
    def __init__(self, epochs):
        self.epochs = epochs
    def to_json(self):
        return {"schema": "cropscale.run/1", "epochs": list(range(self.epochs))}
cb = ProvenanceCallback()
cb.path = sys.argv[1] + "/run.json"
cb.record = Record(3)
cb._write()
files.os.fsync = kill
cb.record = Record(300000)
cb._write()
""",
    # the normalisation statistics (NormStats.save)
    "stats.json": """
import numpy as np
from cropscale.data.stats import NormStats
NormStats(np.arange(10.0), np.ones(10), folds=[1], patch_ids=[1]).save(sys.argv[1] + "/stats.json")
files.os.fsync = kill
NormStats(np.zeros(10), np.ones(10), folds=[1], patch_ids=list(range(300000))).save(sys.argv[1] + "/stats.json")
""",
    # the study table (write_outputs writes study_table.csv first)
    "study_table.csv": """
from pathlib import Path
from cropscale.study.outputs import write_outputs
from cropscale.study.spec import load_spec
spec = load_spec("configs/study/cpu.yaml")
write_outputs([], Path(sys.argv[1]), spec)
previous = Path(sys.argv[1], "study_table.csv").read_text()
Path(sys.argv[1], "previous.txt").write_text(previous)
import cropscale.study.outputs as outputs
real = outputs.render_table
class Longer:
    def __init__(self, table):
        self.csv, self.markdown = table.csv + "x" * 300000, table.markdown
outputs.render_table = lambda *a, **k: Longer(real(*a, **k))
files.os.fsync = kill
write_outputs([], Path(sys.argv[1]), spec)
""",
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_kill_while_writing_leaves_the_previous_complete_file(tmp_path, name):
    proc = subprocess.run([sys.executable, "-c", _KILL_AT_FSYNC + WRITERS[name], str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    target = tmp_path / name
    text = target.read_text()
    if name == "run.json":
        assert json.loads(text)["epochs"] == [0, 1, 2]
    elif name == "stats.json":
        saved = json.loads(text)
        assert saved["s2"]["mean"] == [float(i) for i in range(10)] and saved["patch_ids"] == [1]
    else:
        assert text == (tmp_path / "previous.txt").read_text() and "x" * 100 not in text
    # the new content went only to the temporary file beside it, which the kill left behind
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(f".{name}.") and p.name.endswith(".tmp")]
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 300000


def test_one_resource_lookup_looks_in_the_working_directory_the_checkout_and_shared(tmp_path, monkeypatch):
    """:func:`cropscale.files.find_resource`, the one lookup of the checkout's files, on a fake checkout."""
    from cropscale import files

    checkout, cwd = tmp_path / "repo", tmp_path / "work"
    for folder in (checkout / "configs", tmp_path / "shared" / "data" / "s", checkout / "data" / "s", cwd):
        folder.mkdir(parents=True)
    (checkout / "configs" / "a.yaml").write_text("a: 1\n")
    (tmp_path / "shared" / "data" / "s" / "metadata.geojson").write_text("{}")
    monkeypatch.setattr(files, "CHECKOUT", checkout)
    monkeypatch.chdir(cwd)
    assert files.resource_places("configs/a.yaml") == [cwd / "configs/a.yaml", checkout / "configs/a.yaml",
                                                       tmp_path / "shared" / "configs/a.yaml"]
    assert files.find_resource("configs/a.yaml", "config") == (checkout / "configs" / "a.yaml").resolve()
    # the checkout's data/s exists but holds no metadata.geojson: the shared one is the dataset root
    assert files.find_resource("data/s", "data root", holding="metadata.geojson") == tmp_path / "shared/data/s"
    (cwd / "configs").mkdir()
    (cwd / "configs" / "a.yaml").write_text("a: 2\n")  # the working directory's comes first, unless cwd=False
    assert files.find_resource("configs/a.yaml", "config").read_text() == "a: 2\n"
    assert files.find_resource("configs/a.yaml", "config", cwd=False).read_text() == "a: 1\n"
    absolute = checkout / "configs" / "a.yaml"
    assert files.resource_places(absolute) == [absolute]
    with pytest.raises(files.CropScaleError) as err:
        files.find_resource("configs/b.yaml", "precision config", hint="see configs/precision")
    assert str(err.value) == (f"precision config not found: configs/b.yaml (tried {cwd}/configs/b.yaml or "
                              f"{checkout}/configs/b.yaml or {tmp_path}/shared/configs/b.yaml); see configs/precision")
    assert "\n" not in str(err.value)
