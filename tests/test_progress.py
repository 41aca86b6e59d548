"""Progress lines on stderr: configuration i of n, steps, time left computed from a fake clock."""

import io

import pytest

from cropscale.progress import Progress, format_duration


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_format_duration():
    assert format_duration(0) == "0 s"
    assert format_duration(59.4) == "59 s"
    assert format_duration(190) == "3 min 10 s"
    assert format_duration(3600 + 5 * 60 + 20) == "1 h 05 min"
    with pytest.raises(ValueError):
        format_duration(-1)


def test_lines_and_time_left_from_the_step_rate_then_the_mean_duration():
    clock, out = Clock(), io.StringIO()
    p = Progress(total=3, label="bench", stream=out, clock=clock, min_interval=0)
    p.start("FP32 batch 1", steps=10)
    assert p.eta_s() is None  # nothing done yet: no basis
    clock.t += 4.0
    p.step(2)  # 2 s per step: this one 20 s in all, 16 s left, and 2 more of 20 s each
    assert p.eta_s() == pytest.approx(16 + 2 * 20)
    clock.t += 16.0
    p.step(10)
    assert p.finish() == pytest.approx(20.0)
    p.start("FP32 batch 2", steps=10)
    # one finished configuration of 20 s: 2 left (the current one included) x 20 s
    assert p.eta_s() == pytest.approx(20 + 20)
    clock.t += 5.0
    p.step(5)  # 1 s per step now: 5 s left here, then the last one at the mean 20 s
    assert p.eta_s() == pytest.approx(5 + 20)
    text = out.getvalue().splitlines()
    assert text[0] == "bench: [1/3] FP32 batch 1 (10 steps)"
    assert text[1] == "bench: [1/3] FP32 batch 1: step 2/10, about 56 s left"
    assert text[3] == "bench: [2/3] FP32 batch 2 (10 steps), about 40 s left"
    assert text[4] == "bench: [2/3] FP32 batch 2: step 5/10, about 25 s left"


def test_step_lines_are_rate_limited_and_notes_always_print():
    clock, out = Clock(), io.StringIO()
    p = Progress(total=1, label="x", stream=out, clock=clock, min_interval=2.0)
    p.note("bf16 is slow here")
    p.start("a", steps=100)
    for i in range(1, 11):
        clock.t += 0.5
        p.step(i)
    lines = out.getvalue().splitlines()
    assert lines[0] == "x: bf16 is slow here"
    # 5 s in steps of 0.5 s, a line at most every 2 s: at 2.0 s and 4.0 s after the start
    assert [ln.split(": ")[-1].split(",")[0] for ln in lines[2:]] == ["step 4/100", "step 8/100"]


def test_defaults_to_stderr_and_checks_arguments(capsys):
    p = Progress(total=1, label="y")
    p.note("hello")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "y: hello\n"
    with pytest.raises(ValueError):
        Progress(total=-1, label="z")
    with pytest.raises(RuntimeError):
        p.finish()
