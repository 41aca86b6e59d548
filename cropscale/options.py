"""The analysis subcommands' options: each command is one dataclass, parsed by jsonargparse.

A subcommand (``python -m cropscale benchmark``, ``report``, ``study``, ...) declares its options once, as a
dataclass whose fields carry a type, a default and a docstring (the ``--help`` text). The options several
commands share are declared here once (:class:`SampleShape`, :class:`CropSize`, :class:`Warmup`,
:class:`Threads`, :class:`Device`, :class:`Seed`, :class:`JsonOut`) and reused by inheritance; a command that
needs another default redeclares the field with its default only (the docstring is found on the base).

:func:`parse_options` hands the dataclass to jsonargparse (``ArgumentParser.add_class_arguments``: types,
defaults and the field docstrings, read with docstring-parser), parses, and builds the dataclass from the
parsed values; its ``__post_init__`` checks the ranges. :class:`OptionsParser` gives jsonargparse's arguments
the commands' style, through the hook jsonargparse documents for it (overriding ``add_argument``): option
``--crop-size`` for field ``crop_size``; ``list[X]`` fields take one or more values, ``--workers 0 2``, or,
when the default is empty, are repeatable, ``--speedup 2:1.6 --speedup 4:2.9``; a ``bool`` field defaulting
to False is a flag, one defaulting to None or True has a ``--no-`` form.

One option name per meaning in every command: a JSON file of the figures is ``--json FILE`` (:class:`JsonOut`),
a folder of outputs ``--output DIR`` (``report``, ``study``, as ``predict --output DIR``). An option an earlier
release spelt otherwise (``benchmark --output``, ``report --out``) is refused naming the new one.

Errors: a value of the wrong type, an unknown or missing option raise :class:`OptionError`, one line naming
the option (``--t2: expected an integer, got 'x'``); the CLI prints it as ``cropscale: error: ...`` and exits
with status 2. ``--help`` prints the options and exits with status 0.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, TypeVar

from jsonargparse import ActionYesNo, ArgumentError, ArgumentParser, set_parsing_settings

from cropscale.env.host import set_torch_threads
from cropscale.errors import CropScaleError

T = TypeVar("T")


class OptionError(CropScaleError):
    """A command-line option of an analysis subcommand is unknown, missing, of the wrong type or out of range.

    The message starts with the option (``--t2: ...``) and ends with where to read the options.
    """


# ------------------------------------------------------------------------------------- shared options
@dataclasses.dataclass(kw_only=True)
class Options:
    """The base of every command's options: range checks from ``AT_LEAST``, then :meth:`check`.

    Class attributes (not options): ``POSITIONAL``, fields given without ``--`` (in order); ``AT_LEAST``,
    ``{field: lowest value}``, merged over the bases; ``RENAMED``, ``{old option: field}`` for an option of an
    earlier release, refused with one line naming the field's option (``--out is now --output: ...``), never
    silently ignored.
    """

    POSITIONAL: ClassVar[tuple[str, ...]] = ()
    AT_LEAST: ClassVar[dict[str, float]] = {}
    RENAMED: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        lows: dict[str, float] = {}
        for klass in reversed(type(self).__mro__):
            lows.update(vars(klass).get("AT_LEAST", {}))
        check_at_least(self, **lows)
        self.check()

    def check(self) -> None:
        """The command's own checks of its options together (none here).

        Raises:
            OptionError: in a subclass, options that do not go together (named).
        """


@dataclasses.dataclass(kw_only=True)
class SampleShape(Options):
    """The time-series lengths of one sample (synthetic batches and crops of the real data)."""

    t2: int = 16
    """Sentinel-2 dates per sample (T2)"""
    t1: int = 4
    """Sentinel-1 dates per orbit (T1)"""

    AT_LEAST: ClassVar[dict[str, float]] = {"t2": 1, "t1": 1}


@dataclasses.dataclass(kw_only=True)
class CropSize(Options):
    """The side of a square training crop."""

    crop_size: int = 32
    """crop side H = W in 10 m pixels (multiple of 4)"""

    AT_LEAST: ClassVar[dict[str, float]] = {"crop_size": 1}


@dataclasses.dataclass(kw_only=True)
class Warmup(Options):
    """Unmeasured first steps (compilation, allocator and cache warm-up fall here)."""

    warmup: int = 3
    """unmeasured first steps or runs (>= 0)"""

    AT_LEAST: ClassVar[dict[str, float]] = {"warmup": 0}


@dataclasses.dataclass(kw_only=True)
class Threads(Options):
    """The intra-op thread count of torch on the CPU."""

    threads: int | None = None
    """torch.set_num_threads before measuring (CPU; default: torch's own choice)"""

    AT_LEAST: ClassVar[dict[str, float]] = {"threads": 1}

    def apply(self) -> None:
        """Set torch's threads when a count is given (:func:`cropscale.env.host.set_torch_threads`)."""
        set_torch_threads(self.threads)


@dataclasses.dataclass(kw_only=True)
class Device(Options):
    """The device of the measurement."""

    device: str | None = None
    """cpu | cuda | cuda:i (default: cuda if available, else cpu)"""

    def device_name(self) -> str:
        """``device``, or ``cuda`` when CUDA is available and ``cpu`` otherwise."""
        import torch

        return self.device or ("cuda" if torch.cuda.is_available() else "cpu")


@dataclasses.dataclass(kw_only=True)
class Seed(Options):
    """The seed of the weights and synthetic data."""

    seed: int = 0
    """seed of the weights and the synthetic data"""


@dataclasses.dataclass(kw_only=True)
class JsonOut(Options):
    """A JSON file the command also writes: ``--json FILE`` in every command (a folder is ``--output DIR``)."""

    json: str | None = None
    """also write the figures to this JSON file"""


# ----------------------------------------------------------------------------------------- checks
def check_at_least(options: Any, **lows: float) -> None:
    """Raise :class:`OptionError` naming ``--<field>`` when a set field of ``options`` is below its low.

    ``None`` values (an option left unset) and bools are not checked. List fields are checked item by item.
    """
    for name, low in lows.items():
        value = getattr(options, name)
        items = value if isinstance(value, (list, tuple)) else [value]
        bad = [v for v in items if v is not None and not isinstance(v, bool) and v < low]
        if bad:
            raise OptionError(f"{flag(name)} must be >= {low:g}, got {value!r}")


def flag(name: str) -> str:
    """The option of a field: ``crop_size`` -> ``--crop-size``."""
    return "--" + name.replace("_", "-")


# ----------------------------------------------------------------------------------------- parsing
def _without_none(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``; any other type (``X | Y | None`` included) -> ``(type, False)``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return tp, False


def describe_type(tp: Any) -> str:
    """What a value of type ``tp`` must be, in words (``an integer``, ``one of a, b``)."""
    tp, _ = _without_none(tp)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if origin in (list, tuple, Sequence):
        return "one or more values, each " + describe_type(typing.get_args(tp)[0])
    if dict in (tp, origin):
        return "a JSON object"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


class OptionsParser(ArgumentParser):
    """jsonargparse's parser with the analysis commands' option style (see the module docstring).

    ``add_argument`` is the hook jsonargparse documents for changing how the arguments it makes from a
    signature or a dataclass look on the command line; everything else (types, defaults, help) is its own.
    ``positional``: fields given without ``--`` (:attr:`Options.POSITIONAL`).
    """

    positional: tuple[str, ...] = ()
    hints: dict[str, Any] = {}

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        """One field's argument: ``--a-b`` for ``--a_b``, lists as ``nargs``, bools as flags.

        jsonargparse's own ``--x+`` (append to a list) is left out: a list option takes its values as above.
        """
        name = args[0].removeprefix("--") if args else ""
        if not args or not args[0].startswith("--") or name not in self.hints:
            return super().add_argument(*args, **kwargs)
        inner, _ = _without_none(self.hints[name])
        if inner is bool:
            kwargs.pop("type", None)
            kwargs["action"] = "store_true" if kwargs.get("default") is False else ActionYesNo(no_prefix="no-")
        elif typing.get_origin(inner) in (list, tuple, Sequence):
            kwargs.pop("action", None)  # jsonargparse's list type: a YAML list or --x+
            kwargs["type"] = typing.get_args(inner)[0]
            # an empty default: repeatable, each use adds its values; else one use gives them all
            kwargs.update(nargs="*", action="extend") if kwargs.get("default") == [] else kwargs.update(nargs="+")
        if name in self.positional:
            kwargs.pop("required", None)
            return super().add_argument(name, **kwargs)
        return super().add_argument(flag(name), **kwargs)


def options_parser(cls: type, prog: str, description: str | None = None, epilog: str | None = None) -> OptionsParser:
    """The :class:`OptionsParser` of the dataclass ``cls``: the command's own options first, then the shared ones.

    Nothing is parsed here (see :func:`parse_options`).
    """
    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # the field docstrings are the --help text
    parser = OptionsParser(prog=prog, description=description or inspect.cleandoc(cls.__doc__ or ""),
                           epilog=epilog, exit_on_error=False, allow_abbrev=False)
    parser.positional = tuple(getattr(cls, "POSITIONAL", ()))
    parser.hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    own = set(vars(cls).get("__annotations__", {})) - _base_fields(cls)
    parser.add_class_arguments(cls, as_group=False, skip=fields - own)
    parser.add_class_arguments(cls, as_group=False, skip=own)
    return parser


def _base_fields(cls: type) -> set[str]:
    """Fields that a base of ``cls`` declares (``cls`` may redeclare them with another default)."""
    return {f.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}


def error_line(err: Exception, cls: type, show: Callable[[str], str] = flag) -> str:
    """A jsonargparse error about the fields of the dataclass ``cls`` as one line naming the field.

    ``show`` writes a field's name (default :func:`flag`: ``--crop-size``; positional fields as they are).
    Examples: ``--t2: expected an integer, got 'x'``; ``missing --config``.
    """
    positional = getattr(cls, "POSITIONAL", ())
    hints = typing.get_type_hints(cls)

    def shown(name: str) -> str:
        return name if name in positional else show(name)

    text = str(err)
    required = re.match(r"the following arguments are required: (.*)", text)
    if required:
        return "missing " + ", ".join(shown(n.strip().lstrip("-").replace("-", "_")) for n in
                                      required.group(1).split(","))
    argparse_own = re.match(r"argument (?:--)?([\w-]+)(?:/[\w-]+)?: (invalid \w+ value: |expected at least one)(.*)$",
                            text)  # argparse's own checks, before jsonargparse's
    if argparse_own:
        name, what, got = argparse_own.group(1).replace("-", "_"), argparse_own.group(2), argparse_own.group(3)
        return f"{shown(name)}: expected {describe_type(hints.get(name, str))}" + (f", got {got}" if "invalid" in what
                                                                                    else ", got none")
    key = re.search(r'Parser key "([^"]+)"', text)
    if key:
        name = key.group(1)
        got = re.search(r"(?:Got|Given) value: (.*)$", text, re.M)
        if got:
            return f"{shown(name)}: expected {describe_type(hints.get(name, str))}, got {got.group(1).strip()!r}"
        return f"{shown(name)}: " + " ".join(text.split("\n", 1)[-1].split())
    return " ".join(text.split())


def _renamed(cls: type, parser: OptionsParser, argv: Sequence[str]) -> str | None:
    """The line for an option of ``cls.RENAMED`` in ``argv`` (``--out`` or ``--out=DIR``) naming its new name."""
    renamed = getattr(cls, "RENAMED", {})
    old = next((t.split("=", 1)[0] for t in argv if t.split("=", 1)[0] in renamed), None)
    if old is None:
        return None
    new = flag(renamed[old])
    doc = next(a.help for a in parser._actions if new in a.option_strings) or ""
    doc = doc.split(" (type:")[0].split(" (default:")[0].strip()  # the field docstring without jsonargparse's suffix
    return f"{old} is now {new}{': ' + doc if doc else ''}"


def parse_options(cls: type[T], argv: Sequence[str] | None, prog: str, description: str | None = None,
                  epilog: str | None = None) -> T:
    """Parse ``argv`` into the options dataclass ``cls`` (``--help`` prints them and exits with status 0).

    Raises:
        OptionError: an unknown or missing option, a value of the wrong type (one line naming the option),
            an option of ``cls.RENAMED`` (naming the new one), or a value that ``cls.__post_init__`` refuses.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = options_parser(cls, prog, description, epilog)
    try:
        namespace = parser.parse_args(argv)
    except ArgumentError as err:  # an old spelling is never an option of the new ones: it ends here too
        raise OptionError(f"{_renamed(cls, parser, argv) or error_line(err, cls)} (see: {prog} --help)") from None
    return cls(**{k: v for k, v in namespace.as_dict().items() if not k.startswith("__")})
