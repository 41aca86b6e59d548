"""The analysis subcommands' options (cropscale/options.py): every documented command line parses, --help works,
a bad option or value ends in one line naming the option with exit status 2, and the shared options behave."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from cropscale.bench.callbacks import CallbackBenchOptions
from cropscale.bench.levers import LeverOptions
from cropscale.bench.loader import LoaderOptions
from cropscale.bench.pipeline import PipelineOptions
from cropscale.bench.step.config import BenchmarkConfig
from cropscale.bench.summary import SummaryOptions
from cropscale.bench.tiling import TilingOptions
from cropscale.cli import main as cli
from cropscale.options import OptionError, Options, SampleShape, Threads, Warmup, check_at_least, parse_options
from cropscale.report.command import ReportOptions
from cropscale.study.analytical import AssertBenchOptions, ScalingOptions
from cropscale.study.runner import StudyOptions

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {
    "summary": SummaryOptions, "benchmark": BenchmarkConfig, "report": ReportOptions, "study": StudyOptions,
    "scaling": ScalingOptions, "loader-bench": LoaderOptions, "tiling-bench": TilingOptions,
    "callback-bench": CallbackBenchOptions, "lever-bench": LeverOptions, "pipeline-bench": PipelineOptions,
}
#: shell variables of scripts/ and the values they hold there (scripts/gpu_check.sh)
SHELL_VALUES = {"$BATCHES": ["1", "2", "4"], '"$BEST"': ["4"], '"$mode"': ["reduce-overhead"]}


def _code_text(path: Path) -> str:
    """The parts of a file that are commands: code blocks and inline code of Markdown, YAML comments, the rest."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
        spans = re.findall(r"`([^`\n]*cropscale[^`\n]*)`", re.sub(r"```.*?```", "", text, flags=re.S))
        return "\n".join(blocks + spans)
    if path.suffix == ".yaml":
        return "\n".join(line.lstrip("# ") for line in text.splitlines() if line.lstrip().startswith("#"))
    return text


def _arguments(rest: str) -> list[str]:
    """The arguments of one documented command line (``[...]`` optional parts included, placeholders filled)."""
    for var, values in SHELL_VALUES.items():
        rest = rest.replace(var, " ".join(values))
    out = []
    for token in shlex.split(rest, comments=True):
        if token in ("|", ";", "&&", "||", "2>&1") or token.startswith(">"):
            break
        if token.startswith("$(") and token.endswith(")"):  # a Makefile variable such as $(ARGS)
            continue
        token = token.strip("[]()")
        if token.endswith(":"):  # "cropscale report runs --output reports: reports/report.md ..."
            out.append(token[:-1])
            break
        if token not in ("", "..."):
            out.append("PATH" if "$" in token or token.startswith("<") else token)
    return out


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """``(file, subcommand, arguments)`` of every analysis command line in the README, Makefile, docs/, scripts/
    and the study configs.

    Read while collecting (it parametrizes a test): a file a copy of the project lacks is left out, so that the GPU
    check's copy (no README, no docs) collects; in a checkout the next test requires the commands of every file.
    """
    files = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "scripts").glob("*.sh")), *sorted((ROOT / "configs").rglob("*.yaml"))]
    files = [path for path in files if path.is_file()]
    pattern = re.compile(rf"cropscale ({'|'.join(map(re.escape, OPTIONS))})(?![\w-])(.*)")
    found = []
    for path in files:
        for line in _code_text(path).replace("\\\n", " ").splitlines():
            for match in pattern.finditer(line):
                found.append((str(path.relative_to(ROOT)), match.group(1), _arguments(match.group(2))))
    return found


DOCUMENTED = documented_commands()


def test_the_documents_hold_commands_of_every_subcommand():
    """The extraction sees the commands (an empty list would make the next test pass on nothing)."""
    assert {"README.md", "Makefile"} <= {where for where, _, _ in DOCUMENTED}  # none left out in a checkout
    assert {sub for _, sub, _ in DOCUMENTED} == set(OPTIONS)
    assert ("scripts/gpu_check.sh", "benchmark") in {(f, s) for f, s, _ in DOCUMENTED}
    assert len(DOCUMENTED) >= 40


@pytest.mark.parametrize("where, sub, argv", DOCUMENTED, ids=[f"{f}:{s}:{i}" for i, (f, s, _) in enumerate(DOCUMENTED)])
def test_every_documented_command_line_parses(where, sub, argv):
    if sub == "scaling" and argv[:1] == ["assert-bench"]:
        cls, argv = AssertBenchOptions, argv[1:]
    else:
        cls = OPTIONS[sub]
    options = parse_options(cls, argv, f"python -m cropscale {sub}")
    assert isinstance(options, cls)


def test_documented_values_arrive_in_the_options():
    """One documented line read field by field (docs/05_gpu_check.md: the first benchmark line)."""
    argv = ["--precision", "32-true", "bf16-mixed", "--batch-sizes", "1", "4", "--json", "bench.json"]
    assert argv in [a for _, s, a in DOCUMENTED if s == "benchmark"]
    options = parse_options(BenchmarkConfig, argv, "benchmark")
    assert options.precision == ["32-true", "bf16-mixed"] and options.batch_sizes == [1, 4]
    assert options.json == "bench.json" and options.warmup == 10 and options.t2 == 16 and options.threads is None


#: the analysis commands that write a JSON file of their figures, and those that write into a folder
JSON_FILE_COMMANDS = ("benchmark", "tiling-bench", "callback-bench", "lever-bench", "loader-bench", "pipeline-bench",
                      "scaling")
FOLDER_COMMANDS = ("report", "study")


def test_one_option_name_per_meaning():
    """A JSON file is ``--json FILE`` in every command, a folder ``--output DIR`` (as ``predict --output DIR``)."""
    names = {sub: {f.name for f in dataclasses.fields(cls)} for sub, cls in OPTIONS.items()}
    assert all("json" in names[sub] and "output" not in names[sub] for sub in JSON_FILE_COMMANDS), names
    assert all("output" in names[sub] and "json" not in names[sub] for sub in FOLDER_COMMANDS), names
    assert not any("out" in fields for fields in names.values())
    assert parse_options(BenchmarkConfig, ["--json", "b.json"], "benchmark").json == "b.json"
    assert parse_options(TilingOptions, ["--json", "t.json"], "tiling-bench").json == "t.json"
    assert parse_options(ReportOptions, ["runs", "--output", "r"], "report").output == "r"
    assert parse_options(StudyOptions, ["--config", "c.yaml", "--output", "s"], "study").output == "s"


@pytest.mark.parametrize("sub, argv, line", [
    ("benchmark", ["--output", "b.json"], "--output is now --json: also write the figures to this JSON file"),
    ("benchmark", ["-o", "b.json"], "-o is now --json: also write the figures to this JSON file"),
    ("tiling-bench", ["--output=t.json"], "--output is now --json: also write the figures to this JSON file"),
    ("report", ["runs", "--out", "r"], "--out is now --output: output folder"),
    ("study", ["--config", "c.yaml", "--out=s"], "--out is now --output: study folder (default runs/study/<name>)"),
])
def test_an_old_option_name_is_refused_naming_the_new_one(sub, argv, line):
    """Parsed only (on a parser that took the old name, the benchmark would run)."""
    prog = f"python -m cropscale {sub}"
    with pytest.raises(OptionError) as info:
        parse_options(OPTIONS[sub], argv, prog)
    assert str(info.value) == f"{line} (see: {prog} --help)"


def _run_cli(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    out, err = capsys.readouterr()
    return info.value.code, out, err


def test_an_old_option_name_ends_in_one_line_with_status_2(tmp_path, capsys):
    code, _, err = _run_cli(["report", str(tmp_path), "--out", str(tmp_path / "r")], capsys)
    assert code == 2
    assert err.strip().splitlines() == ["cropscale: error: --out is now --output: output folder "
                                        "(see: python -m cropscale report --help)"]


@pytest.mark.parametrize("sub", [*OPTIONS, "scaling assert-bench"])
def test_help_exits_0_and_shows_the_field_docs(sub, capsys):
    code, out, _ = _run_cli([*sub.split(), "--help"], capsys)
    assert code == 0
    assert out.split()[:4 + len(sub.split())] == ["usage:", "python", "-m", "cropscale", *sub.split()]
    cls = AssertBenchOptions if sub.endswith("assert-bench") else OPTIONS[sub]
    for f in dataclasses.fields(cls):
        assert ("--" + f.name.replace("_", "-") in out) or (f.name in cls.POSITIONAL and f.name in out), f.name


def test_help_text_is_the_field_docstring(capsys):
    _, out, _ = _run_cli(["summary", "--help"], capsys)
    assert "Sentinel-2 dates per sample (T2)" in out  # SampleShape.t2's docstring
    assert "semantic classes (10 bundled sample, 20 PASTIS)" in out  # SummaryOptions.num_classes's


# each subcommand, one option of it given a value of the wrong type: the one line the user reads
BAD_VALUES = [
    (["summary", "--t2", "x"], "--t2: expected an integer, got 'x'"),
    (["benchmark", "--iterations", "1.5"], "--iterations: expected an integer, got '1.5'"),
    (["benchmark", "--precision", "64-true"],
     "--precision: expected one or more values, each one of 32-true, 16-mixed, bf16-mixed, got '64-true'"),
    (["report", "runs", "--margin", "wide"], "--margin: expected a number, got 'wide'"),
    (["study", "--config", "c.yaml", "--max-devices", "two"], "--max-devices: expected an integer, got 'two'"),
    (["scaling", "--alpha-us", "fast"], "--alpha-us: expected a number, got 'fast'"),
    (["scaling", "assert-bench", "--seed", "s"], "--seed: expected an integer, got 's'"),
    (["loader-bench", "--workers", "0", "two"], "--workers: expected one or more values, each an integer, got 'two'"),
    (["tiling-bench", "--precision", "64"], "--precision: expected one of 32, 16-mixed, bf16-mixed, got '64'"),
    (["callback-bench", "--threads", "many"], "--threads: expected an integer, got 'many'"),
    (["lever-bench", "--levers", "turbo"],
     "--levers: expected one or more values, each one of channels_last, fused, compile, pinned, got 'turbo'"),
    (["pipeline-bench", "--crop-size", "big"], "--crop-size: expected an integer, got 'big'"),
]


@pytest.mark.parametrize("argv, line", BAD_VALUES, ids=[" ".join(a[:2]) for a, _ in BAD_VALUES])
def test_a_bad_value_is_one_line_naming_the_option_with_status_2(argv, line, capsys):
    code, _, err = _run_cli(argv, capsys)
    sub = " ".join(argv[:2]) if argv[1] == "assert-bench" else argv[0]
    assert code == 2
    assert err.strip().splitlines() == [f"cropscale: error: {line} (see: python -m cropscale {sub} --help)"]


@pytest.mark.parametrize("argv, line", [
    (["benchmark", "--batch-size", "2"], "unrecognized arguments: --batch-size 2"),  # it is --batch-sizes
    (["report"], "missing inputs"),
    (["study"], "missing --config"),
    (["tiling-bench", "--warmup", "-1"], "--warmup must be >= 0, got -1"),
    (["lever-bench", "--threads", "0"], "--threads must be >= 1, got 0"),
    (["scaling", "--params", "10", "--from-model"], "give one of --params and --from-model"),
])
def test_unknown_missing_and_out_of_range_options(argv, line, capsys):
    code, _, err = _run_cli(argv, capsys)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(f"cropscale: error: {line}")


def test_the_shared_options_are_declared_once():
    """``--t2`` / ``--threads`` / ``--warmup`` come from one declaration, with per-command defaults."""
    for cls in (SummaryOptions, BenchmarkConfig, LoaderOptions, TilingOptions, CallbackBenchOptions, LeverOptions,
                PipelineOptions):
        assert issubclass(cls, SampleShape) and issubclass(cls, Warmup)
    assert LeverOptions().t2 == 8 and BenchmarkConfig().t2 == 16  # lever-bench's smaller default shape
    assert CallbackBenchOptions().threads == 1 and issubclass(CallbackBenchOptions, Threads)


def test_lists_flags_and_repeatable_options():
    loader = parse_options(LoaderOptions, ["--workers", "0", "2", "4", "--no-model"], "loader-bench")
    assert loader.workers == [0, 2, 4] and loader.model is False
    scaling = parse_options(ScalingOptions, ["--params", "5", "--speedup", "2:1.5", "--speedup", "4:2.5",
                                             "--speedup-evidence", "measured-run"], "scaling")
    assert scaling.speedup == ["2:1.5", "4:2.5"]  # repeatable: each use adds
    assert parse_options(ScalingOptions, ["--params", "5"], "scaling").speedup == []
    assert parse_options(PipelineOptions, ["--pin-memory"], "p").pin_memory is True
    assert parse_options(PipelineOptions, [], "p").pin_memory is None


def test_check_at_least_names_the_option_and_skips_unset_values():
    @dataclasses.dataclass(kw_only=True)
    class Demo(Options):
        batch_size: int | None = None
        workers: list[int] = dataclasses.field(default_factory=lambda: [0])

    check_at_least(Demo(), batch_size=1, workers=0)  # None is "not given": not checked
    with pytest.raises(OptionError, match=r"^--batch-size must be >= 1, got 0$"):
        check_at_least(Demo(batch_size=0), batch_size=1)
    with pytest.raises(OptionError, match=r"^--workers must be >= 0, got \[2, -1\]$"):
        check_at_least(Demo(workers=[2, -1]), workers=0)


# ---------------------------------------------------------------------------------- the options, written out
#: Each command's options as ``--help`` lists them (positional arguments by name), and the values a command gets
#: when an option is not given. Written out here, not read from the code: a renamed option or a changed default
#: fails the tests below (issue 35: the options moved onto jsonargparse's own dataclass support unchanged).
SHAPE = {"--t2": 16, "--t1": 4}
WRITTEN: dict[str, tuple[list[str], dict[str, object]]] = {
    "summary": (["--num-classes", "--height", "--width", "--time", "--iterations", "--device", "--threads",
                 "--warmup", "--t2", "--t1"],
                {"num_classes": 10, "height": 32, "width": 32, "time": [], "iterations": 5, "device": "cpu",
                 "threads": None, "warmup": 2, "t2": 16, "t1": 4}),
    "benchmark": (["--precision", "--batch-sizes", "--iterations", "--channels-last", "--compile", "--compile-mode",
                   "--fused", "--tf32", "--stop-at-oom", "--order", "--max-seconds", "--num-classes", "--net-kwargs",
                   "--lr", "--weight-decay", "--peak-tflops", "--details", "--json", "--seed", "--threads", "--device",
                   "--warmup", "--crop-size", "--t2", "--t1"],
                  {"precision": ["32-true", "16-mixed"], "batch_sizes": [1, 2, 4], "iterations": 30,
                   "channels_last": False, "compile": False, "compile_mode": "default", "fused": False, "tf32": False,
                   "stop_at_oom": False, "order": "precision", "max_seconds": None, "num_classes": 10, "lr": 0.001,
                   "weight_decay": 0.01, "peak_tflops": None, "details": False, "json": None, "seed": 0,
                   "threads": None, "device": None, "warmup": 10, "crop_size": 32, "t2": 16, "t1": 4}),
    "report": (["inputs", "--output", "--stem", "--margin", "--target-fraction", "--verdicts-only"],
               {"output": "reports", "stem": "report", "margin": 0.02, "target_fraction": 0.95,
                "verdicts_only": False}),
    "study": (["--config", "--output", "--data-root", "--dry-run", "--resume", "--node-rank", "--max-devices"],
              {"output": None, "data_root": None, "dry_run": False, "resume": False, "node_rank": 0,
               "max_devices": None}),
    "scaling": (["--params", "--from-model", "--bytes-per-element", "--devices", "--serial-fractions", "--alpha-us",
                 "--bandwidth-gbs", "--bucket-cap-mb", "--first-bucket-mb", "--speedup", "--speedup-evidence",
                 "--json"],
                {"from_model": False, "bytes_per_element": 4.0, "devices": [2, 4, 8],
                 "serial_fractions": [0.1, 0.2, 0.35], "alpha_us": 10.0, "bandwidth_gbs": [10.0], "bucket_cap_mb": 25,
                 "first_bucket_mb": 1, "speedup": [], "speedup_evidence": None, "json": None}),
    "scaling assert-bench": (["--per-cell", "--multi", "--resamples", "--class-step", "--json", "--seed"],
                             {"per_cell": 3, "multi": 96, "resamples": 1000, "class_step": 1, "json": None,
                              "seed": 0}),
    "loader-bench": (["--root", "--workers", "--batches", "--batch-size", "--train-folds", "--ignore-index",
                      "--model", "--no-model", "--model-steps", "--device", "--json", "--seed", "--warmup",
                      "--crop-size", "--t2", "--t1", "--checks", "--rounds", "--clock"],
                     {"root": None, "workers": [0, 2], "batches": 40, "batch_size": 4, "train_folds": [1],
                      "ignore_index": None, "model": True, "model_steps": None, "device": "cpu", "json": None,
                      "seed": 0, "warmup": 4, "crop_size": 32, "t2": 16, "t1": 4, "checks": ["on"], "rounds": 1,
                      "clock": "wall"}),
    "tiling-bench": (["--model", "--patches", "--height", "--width", "--window", "--stride", "--tile-batch-size",
                      "--num-classes", "--precision", "--repeats", "--json", "--threads", "--device", "--warmup",
                      "--t2", "--t1"],
                     {"model": "auto", "patches": 2, "height": 128, "width": 128, "window": 32, "stride": None,
                      "tile_batch_size": 16, "num_classes": 20, "precision": "32", "repeats": 3, "json": None,
                      "threads": None, "device": None, "warmup": 1, "t2": 16, "t1": 4}),
    "callback-bench": (["--steps", "--repeats", "--model", "--features", "--batch", "--log-every", "--block",
                        "--separate", "--lightning", "--no-lightning", "--trace", "--count", "--clock", "--device",
                        "--json", "--threads", "--warmup", "--crop-size", "--t2", "--t1"],
                       {"steps": 1000, "repeats": 3, "model": "linear", "features": 16, "batch": 1,
                        "log_every": 50, "block": 20, "separate": False, "lightning": True, "trace": False,
                        "count": False, "clock": "wall", "device": "cpu", "json": None, "threads": 1, "warmup": 100,
                        "crop_size": 16, "t2": 16, "t1": 4}),  # the None defaults resolved for --model linear
    "lever-bench": (["--precision", "--batch-size", "--levers", "--compile-mode", "--iterations", "--json", "--seed",
                     "--threads", "--device", "--warmup", "--crop-size", "--t2", "--t1"],
                    {"precision": "32-true", "batch_size": 2, "levers": ["channels_last", "fused", "compile", "pinned"],
                     "compile_mode": "default", "iterations": 10, "json": None, "seed": 0, "threads": None,
                     "device": None, "warmup": 3, "crop_size": 16, "t2": 8, "t1": 2}),
    "pipeline-bench": (["--root", "--batch-size", "--precision", "--workers", "--pin-memory", "--no-pin-memory",
                        "--steps", "--train-folds", "--compile", "--json", "--seed", "--threads", "--device",
                        "--warmup", "--crop-size", "--t2", "--t1"],
                       {"root": None, "batch_size": 4, "precision": "32-true", "workers": 0, "pin_memory": None,
                        "steps": 20, "train_folds": [1, 2], "compile": False, "json": None, "seed": 0,
                        "threads": None, "device": None, "warmup": 3, "crop_size": 32, "t2": 16, "t1": 4}),
    "ddp_probe": (["--json", "--devices", "--accelerator", "--global-batch", "--steps", "--seed", "--threads",
                   "--warmup", "--crop-size", "--t2", "--t1"],
                  {"devices": 1, "accelerator": "cpu", "global_batch": 4, "steps": 6, "seed": 0, "threads": 1,
                   "warmup": 2, "crop_size": 16, "t2": 16, "t1": 4}),
}
#: what a command needs to parse at all (its required options)
REQUIRED = {"report": ["runs"], "study": ["--config", "c.yaml"], "scaling": ["--params", "5"],
            "ddp_probe": ["--json", "p.json"]}
PROGS = {"ddp_probe": "python -m cropscale.bench.ddp_probe"}


def _options_class(sub: str) -> type:
    from cropscale.bench.ddp_probe import ProbeOptions

    return {**OPTIONS, "scaling assert-bench": AssertBenchOptions, "ddp_probe": ProbeOptions}[sub]


def _help(sub: str, capsys) -> str:
    prog = PROGS.get(sub, f"python -m cropscale {sub}")
    with pytest.raises(SystemExit) as info:
        parse_options(_options_class(sub), ["--help"], prog)
    assert info.value.code == 0
    return capsys.readouterr().out


def _listed_options(help_text: str) -> list[str]:
    """The options of a ``--help`` text, in order (``-h/--help`` left out), and its positional arguments."""
    body = help_text.split("\n\n", 1)[1]
    found = []
    for line in body.splitlines():
        words = line.strip().split()
        if line.startswith("  ") and words and not line.startswith("   " * 4):
            head = line.strip().split("  ")[0]  # "--model, --no-model   what it is" -> "--model, --no-model"
            found += [w.rstrip(",") for w in head.split() if w.startswith("--") or (w.isidentifier() and w == head)]
    return [o for o in found if o not in ("-h", "--help")]


def test_written_lists_cover_every_command():
    assert set(WRITTEN) == {*OPTIONS, "scaling assert-bench", "ddp_probe"}


@pytest.mark.parametrize("sub", list(WRITTEN))
def test_each_command_keeps_its_option_names_and_defaults(sub, capsys):
    names, defaults = WRITTEN[sub]
    assert sorted(_listed_options(_help(sub, capsys))) == sorted(names)
    parsed = parse_options(_options_class(sub), REQUIRED.get(sub, []), PROGS.get(sub, sub))
    assert {k: getattr(parsed, k) for k in defaults} == defaults


#: per command: an old spelling, a wrong type, an out-of-range value, and the one line each gives
ONE_LINE_ERRORS = [
    ("benchmark", ["--output", "b.json"], "--output is now --json: also write the figures to this JSON file"),
    ("benchmark", ["--batch-sizes", "two"], "--batch-sizes: expected one or more values, each an integer, got 'two'"),
    ("benchmark", ["--iterations", "0"], "--iterations must be >= 1, got 0"),
    ("report", ["runs", "--out", "r"], "--out is now --output: output folder"),
    ("report", ["runs", "--target-fraction", "most"], "--target-fraction: expected a number, got 'most'"),
    ("study", ["--config", "c.yaml", "--node-rank", "-1"], "--node-rank must be >= 0, got -1"),
    ("tiling-bench", ["--output=t.json"], "--output is now --json: also write the figures to this JSON file"),
    ("tiling-bench", ["--repeats", "0"], "--repeats must be >= 1, got 0"),
    ("loader-bench", ["--model", "yes"], "unrecognized arguments: yes"),
    ("loader-bench", ["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    ("pipeline-bench", ["--workers", "-1"], "--workers must be >= 0, got -1"),
    ("callback-bench", ["--clock", "sundial"], "--clock: expected one of wall, cpu, got 'sundial'"),
    ("lever-bench", ["--t2", "0"], "--t2 must be >= 1, got 0"),
    ("summary", ["--time", "1", "x"], "--time: expected one or more values, each an integer, got 'x'"),
    ("scaling", ["--params", "5", "--devices", "0"], "--devices must be >= 1, got [0]"),
    ("scaling assert-bench", ["--resamples", "10"], "--resamples must be >= 100, got 10"),
    ("ddp_probe", ["--out", "p.json"], "--out is now --json: JSON file written by rank 0"),
    ("ddp_probe", ["--json", "p.json", "--steps", "0"], "--steps must be >= 1, got 0"),
]


@pytest.mark.parametrize("sub, argv, line", ONE_LINE_ERRORS, ids=[f"{s} {' '.join(a)}" for s, a, _ in ONE_LINE_ERRORS])
def test_old_spellings_wrong_types_and_out_of_range_values_are_one_line(sub, argv, line):
    prog = PROGS.get(sub, f"python -m cropscale {sub}")
    with pytest.raises(OptionError) as info:
        parse_options(_options_class(sub), argv, prog)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(line), text
