"""Landau orders of one parameter: parsing ``"O(n log n)"`` and the class ladder used by verdicts.

An order is a PMNF term ``n^i log2^j(n)`` (:class:`~cropscale.scaling.pmnf.Term`): exponent ``i``
(a fraction), log power ``j`` (an integer >= 0); ``O(1)`` is ``Term(0, 0)``. Orders compare
lexicographically on ``(i, j)``, which is their asymptotic order for ``i >= 0`` (a negative power
of ``n`` is bounded and has order ``O(1)``).

:func:`parse_order` reads Landau notation with a table of factor patterns (:data:`FACTORS`): each
factor of the product inside ``O(...)`` adds to ``(i, j)``.

:data:`LADDER` holds the 24 classes that verdicts compare by default (after Shudler et al.,
ICS 2015 / TPDS 2019, who focus the model search on the expectation and the classes around it):
every polynomial exponent the PMNF fitter can choose and the log classes at ``n^0`` and ``n^1``::

    O(1) < O(log n) < O(log^2 n) < O(n^(1/4)) < O(n^(1/3)) < O(n^(1/2)) < O(n^(2/3)) < O(n^(3/4))
         < O(n^(4/5)) < O(n) < O(n log n) < O(n log^2 n) < O(n^(5/4)) < O(n^(4/3)) < O(n^(3/2))
         < O(n^(5/3)) < O(n^(7/4)) < O(n^2) < O(n^(9/4)) < O(n^(7/3)) < O(n^(5/2)) < O(n^(8/3))
         < O(n^(11/4)) < O(n^3)

:func:`excess_factor` states the distance between two orders as a factor (``"log n"``,
``"n^(1/2) / log^2 n"``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from cropscale.errors import CropScaleError
from cropscale.scaling.pmnf import CONSTANT, POLY_EXPONENTS, Term

LADDER: tuple[Term, ...] = tuple(
    sorted({Term(i, 0) for i in POLY_EXPONENTS} | {Term(Fraction(i), j) for i in (0, 1) for j in (1, 2)})
)
"""The 24 classes from ``O(1)`` to ``O(n^3)``, in increasing order: every polynomial exponent the
PMNF fitter can choose (:data:`cropscale.scaling.pmnf.POLY_EXPONENTS`) and the log classes
``log n, log^2 n, n log n, n log^2 n``."""

_NAME = r"[A-Za-z_]\w*"
_NUMBER = r"-?\d+(?:\.\d+)?(?:/\d+)?"
_EXPONENT = rf"(?:\^|\*\*)\s*(?:(?P<{{g}}>{_NUMBER})|\(\s*(?P<{{g}}p>{_NUMBER})\s*\))"
_LOG = r"(?:log2|log|ln|lg)"
_RESERVED = frozenset({"log", "log2", "ln", "lg", "sqrt"})


def _exp(group: str) -> str:
    return _EXPONENT.format(g=group)


def _number(text: str, what: str) -> Fraction:
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError) as err:
        raise ValueError(f"{text!r} is not {what}") from err


def _group(m: re.Match, name: str) -> str | None:
    """The text of group ``name`` or of its parenthesised twin ``name + "p"``."""
    return m.group(name) or m.group(name + "p")


def _variable(m: re.Match) -> str | None:
    """The variable of a factor: the first non-empty group whose name starts with ``var``."""
    return next((v for k, v in m.groupdict().items() if k.startswith("var") and v), None)


def _log_power(m: re.Match, name: str) -> int:
    text = _group(m, name)
    if text is None:
        return 1
    p = _number(text, "a log power")
    if p.denominator != 1 or p < 1:
        raise ValueError("a log power must be a positive integer")
    return int(p)


def _log_factor(m: re.Match) -> tuple[str | None, Fraction, int]:
    if _group(m, "pre") and _group(m, "post"):
        raise ValueError("the log power is given twice")
    return _variable(m), Fraction(0), _log_power(m, "pre") * _log_power(m, "post")


def _sqrt_factor(m: re.Match) -> tuple[str | None, Fraction, int]:
    return _variable(m), Fraction(1, 2), 0


def _power_factor(m: re.Match) -> tuple[str | None, Fraction, int]:
    text = _group(m, "e")
    return _variable(m), (Fraction(1) if text is None else _number(text, "an exponent")), 0


FACTORS: tuple[tuple[str, re.Pattern, Callable[[re.Match], tuple[str | None, Fraction, int]]], ...] = (
    (
        "log factor: log n, log2(n), log^2 n, log(n)^2, (log n)^2",
        re.compile(
            rf"(?:\(\s*{_LOG}\s*(?P<var1>{_NAME})\s*\)|{_LOG}\s*(?:{_exp('pre')})?\s*"
            rf"(?:\(\s*(?P<var2>{_NAME})\s*\)|(?P<var3>{_NAME})))\s*(?:{_exp('post')})?"
        ),
        _log_factor,
    ),
    (
        "square root: sqrt n, sqrt(n)",
        re.compile(rf"sqrt\s*(?:\(\s*(?P<var1>{_NAME})\s*\)|(?P<var2>{_NAME}))"),
        _sqrt_factor,
    ),
    ("power: n, n^2, n**2, n^1.5, n^(3/2), n^-1", re.compile(rf"(?P<var>{_NAME})\s*(?:{_exp('e')})?"), _power_factor),
)
"""The factor patterns of :func:`parse_order`, tried in order: (description, pattern, handler); a
handler returns ``(variable, added exponent i, added log power j)``."""

_SEPARATOR = re.compile(r"\s*(?:\*(?!\*)|·)?\s*")


def _read_factor(inner: str, pos: int) -> tuple[int, str, Fraction, int]:
    """The factor at ``pos``: ``(end, variable, i, j)``; ``ValueError`` when none matches."""
    for _, pattern, handler in FACTORS:
        m = pattern.match(inner, pos)
        if m is None:
            continue
        var, i, j = handler(m)
        if var is None or var in _RESERVED:
            raise ValueError("a variable is missing after log/sqrt")
        return m.end(), var, i, j
    rest = inner[pos:]
    if re.match(r"(?:log2?|ln|lg|sqrt)\b", rest):
        raise ValueError("a variable is missing after log/sqrt")
    if re.match(rf"{_NAME}\s*(?:\^|\*\*)", rest):
        raise ValueError(f"cannot read the exponent in {rest!r}")
    raise ValueError(f"cannot read {rest!r}")


def _parse_product(inner: str) -> tuple[Fraction, int, str | None]:
    """``(i, j, variable)`` of the product of factors in ``inner`` (the text between ``O(`` and ``)``)."""
    if inner.strip() == "1":
        return Fraction(0), 0, None
    if not inner.strip():
        raise ValueError("empty O()")
    i, j, var, pos = Fraction(0), 0, None, 0
    while True:
        pos = _SEPARATOR.match(inner, pos).end()
        if pos >= len(inner):
            break
        pos, name, di, dj = _read_factor(inner, pos)
        if var is not None and name != var:
            raise ValueError(f"more than one variable ({var!r} and {name!r}); only one parameter is modelled")
        var, i, j = name, i + di, j + dj
    return i, j, var


def _parse(expected: str) -> tuple[Fraction, int, str | None]:
    m = re.fullmatch(r"\s*[Oo]\s*\((.*)\)\s*", expected)
    if not m:
        raise CropScaleError(f"expected {expected!r}: write it as O(...), e.g. 'O(1)', 'O(n)', 'O(n log n)'")
    try:
        return _parse_product(m.group(1))
    except ValueError as err:
        raise CropScaleError(f"expected {expected!r}: {err}") from None


def parse_order(expected: str | Term) -> Term:
    """Parse Landau notation into its order (:class:`~cropscale.scaling.pmnf.Term`).

    Accepted: ``"O(1)"``, ``"O(log n)"``, ``"O(log^2 n)"``, ``"O((log n)^2)"``, ``"O(sqrt n)"``,
    ``"O(n)"``, ``"O(n log n)"``, ``"O(n^2)"``, ``"O(n**2)"``, ``"O(n^1.5)"``,
    ``"O(n^(3/2) log n)"``, ``"O(p*log2(p))"``: a product (spaces, ``*`` or ``·``) of the factors of
    :data:`FACTORS` in one variable of any name; ``log``, ``log2``, ``lg`` and ``ln`` differ by a
    constant factor only. A negative total exponent (``"O(n^-1)"``) is bounded: ``O(1)``. A
    :class:`Term` is returned as its order.

    Raises:
        CropScaleError: the text is not of that form (the message quotes it and says why).
    """
    if isinstance(expected, Term):
        return expected.order
    if not isinstance(expected, str):
        raise CropScaleError(f"expected must be a string such as 'O(n)' or a Term, got {expected!r}")
    i, j, _ = _parse(expected)
    return CONSTANT if i < 0 else Term(i, j)


def order_variable(expected: str | Term) -> str | None:
    """The variable named in Landau notation (``"batch"`` for ``"O(batch log batch)"``).

    ``None`` for ``"O(1)"`` or a :class:`Term`.

    Raises:
        CropScaleError: as :func:`parse_order`.
    """
    if isinstance(expected, Term):
        return None
    parse_order(expected)
    return _parse(expected)[2]


def order_text(term: Term, var: str = "n") -> str:
    """Landau notation of ``term``'s order, e.g. ``"O(n log n)"``, ``"O(n^(3/2))"``."""
    return term.big_o(var)


def _factor_part(i: Fraction, j: int, var: str) -> str:
    parts = []
    if i == 1:
        parts.append(var)
    elif i != 0:
        parts.append(f"{var}^{i}" if i.denominator == 1 else f"{var}^({i})")
    if j == 1:
        parts.append(f"log {var}")
    elif j > 1:
        parts.append(f"log^{j} {var}")
    return " ".join(parts)


def excess_factor(fitted: Term, expected: Term, var: str = "n") -> str:
    """The factor by which ``fitted`` exceeds ``expected``: ``"log n"``, ``"n^(1/2) / log^2 n"``.

    Returns ``"1"`` when ``fitted`` does not exceed ``expected`` (orders compared as in the module
    docstring).
    """
    f, e = fitted.order, expected.order
    if f <= e:
        return "1"
    di, dj = f.i - e.i, f.j - e.j
    up = _factor_part(di, max(dj, 0), var)
    down = _factor_part(Fraction(0), -dj, var) if dj < 0 else ""
    return f"{up} / {down}" if down else up


def ladder_index(term: Term) -> int | None:
    """Position of ``term``'s order in :data:`LADDER`, or ``None`` when it is not one of them."""
    try:
        return LADDER.index(term.order)
    except ValueError:
        return None


def search_space(expected: Term, *, negative_exponents: bool = False, log_terms: bool = True) -> tuple[Term, ...]:
    """The terms a verdict compares for ``expected``, in increasing order.

    The :data:`LADDER` (without its log classes when ``log_terms`` is false), plus ``expected``
    itself when it is not on the ladder, plus ``expected * n`` when nothing on the ladder lies above
    it (so that a class above the expectation is always searched), plus the bounded powers
    ``n^-1/2, n^-1, n^-2`` (order ``O(1)``) when ``negative_exponents`` is true.

    Raises:
        CropScaleError: ``expected`` has a log power but ``log_terms`` is false.
    """
    e = expected.order
    if e.j and not log_terms:
        raise CropScaleError(f"expected {e.big_o()} has a log factor but log terms are off (some x < 1)")
    terms = {t for t in LADDER if log_terms or t.j == 0}
    terms.add(e)
    if not any(t > e for t in terms):
        terms.add(Term(e.i + 1, e.j))
    if negative_exponents:
        terms.update(Term(Fraction(-k), 0) for k in (Fraction(1, 2), Fraction(1), Fraction(2)))
    return tuple(sorted(terms, key=lambda t: (t.order, -t.i)))
