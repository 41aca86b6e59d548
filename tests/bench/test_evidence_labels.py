"""Evidence labels of the small benchmark commands (issue 12, item 8): a parameter count and the FLOPs that
``torch.utils.flop_counter`` counts are ``count``, not measurements; ``ddp_probe`` times a compute-only step on
synthetic batches, so it is ``measured-microbenchmark``, not ``measured-run``."""

from __future__ import annotations

import json
import re

import pytest

from cropscale.bench import ddp_probe, summary
from cropscale.evidence import COUNT, MEASURED_MICROBENCHMARK

SMALL = ["--t2", "2", "--t1", "1", "--height", "8", "--width", "8"]


def test_summary_labels_parameters_and_flops_as_counts(capsys):
    assert summary.main([*SMALL, "--time", "1", "--warmup", "0", "--iterations", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    params = next(line for line in lines if "parameters:" in line)
    flops = next(line for line in lines if "FLOPs per training sample" in line)
    timing = next(line for line in lines if "forward+backward, batch 1" in line)
    assert f"[{COUNT}: " in params and MEASURED_MICROBENCHMARK not in params
    assert f"[{COUNT}: " in flops and MEASURED_MICROBENCHMARK not in flops
    assert timing.endswith(f"[{MEASURED_MICROBENCHMARK}]")  # a timing is a measurement
    every = [line for line in lines if re.search(r"\[[a-z-]+[]:]", line)]
    assert len(every) == 3  # every figure line carries exactly one label


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_ddp_probe_is_a_microbenchmark(tmp_path):
    out = tmp_path / "probe.json"
    assert ddp_probe.main(["--devices", "1", "--global-batch", "1", "--steps", "1", "--warmup", "0",
                           "--crop-size", "8", "--t2", "2", "--t1", "1", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["evidence"] == MEASURED_MICROBENCHMARK
    assert record["timed_steps"] == 1 and record["world_size"] == 1
