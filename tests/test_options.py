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
from cropscale.bench.step.command import BenchmarkOptions
from cropscale.bench.summary import SummaryOptions
from cropscale.bench.tiling import TilingOptions
from cropscale.cli import main as cli
from cropscale.options import OptionError, Options, SampleShape, Threads, Warmup, check_at_least, parse_options
from cropscale.report.command import ReportOptions
from cropscale.study.analytical import AssertBenchOptions, ScalingOptions
from cropscale.study.runner import StudyOptions

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {
    "summary": SummaryOptions, "benchmark": BenchmarkOptions, "report": ReportOptions, "study": StudyOptions,
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
    """One documented line read field by field (README: the benchmark of the CPU section)."""
    argv = ["--precision", "32-true", "bf16-mixed", "--batch-sizes", "1", "4", "--json", "bench.json"]
    assert argv in [a for _, s, a in DOCUMENTED if s == "benchmark"]
    options = parse_options(BenchmarkOptions, argv, "benchmark")
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
    assert parse_options(BenchmarkOptions, ["--json", "b.json"], "benchmark").json == "b.json"
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
    for cls in (SummaryOptions, BenchmarkOptions, LoaderOptions, TilingOptions, CallbackBenchOptions, LeverOptions,
                PipelineOptions):
        assert issubclass(cls, SampleShape) and issubclass(cls, Warmup)
    assert LeverOptions().t2 == 8 and BenchmarkOptions().t2 == 16  # lever-bench's smaller default shape
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
