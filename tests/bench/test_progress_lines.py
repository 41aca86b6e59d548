"""Long commands: progress on stderr, results on stdout; callback-bench's verdict on a negative overhead."""

from cropscale.bench import callbacks as cb
from cropscale.bench import loader, tiling


def test_tiling_bench_progress_on_stderr(capsys):
    assert tiling.main(["--patches", "1", "--height", "16", "--width", "16", "--window", "8", "--warmup", "0",
                        "--repeats", "2", "--t2", "2", "--t1", "1", "--device", "cpu", "--model", "conv"]) == 0
    captured = capsys.readouterr()
    assert "tiling-bench: [1/2] tiled validation of 1 patch(es) (2 steps)" in captured.err
    assert "tiling-bench: [2/2] one-tile forward" in captured.err
    assert "tiling-bench: [" not in captured.out and "ratio tiled" in captured.out


def test_loader_bench_progress_on_stderr(capsys, flanders_root):
    assert loader.main(["--root", str(flanders_root), "--workers", "0", "--batches", "2", "--warmup", "0",
                        "--batch-size", "1", "--crop-size", "16", "--t2", "2", "--t1", "1", "--no-model"]) == 0
    captured = capsys.readouterr()
    assert "loader-bench: [1/1] 0 worker(s), checks on (3 steps)" in captured.err
    assert "loader-bench: [" not in captured.out and "samples/s" in captured.out


def _result(over_us: float) -> dict:
    return {"overhead_us": {"on": over_us}, "within_target": over_us <= cb.TARGET_US, "target_us": cb.TARGET_US}


def test_callback_bench_verdict():
    assert cb.verdict(_result(42.0)) == "within the 100 µs target"
    assert cb.verdict(_result(177.7)) == "ABOVE the 100 µs target"
    text = cb.verdict(_result(-19.7))
    assert text.startswith("below the noise of this machine") and "within" not in text and "ABOVE" not in text
