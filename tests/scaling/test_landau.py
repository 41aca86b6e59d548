"""Landau notation: parse_order (table of factor patterns), the class ladder, excess factors and the
search space of a verdict."""

import re
from fractions import Fraction

import pytest

from cropscale import CropScaleError
from cropscale.scaling.landau import (
    FACTORS,
    LADDER,
    excess_factor,
    ladder_index,
    order_variable,
    parse_order,
    search_space,
)
from cropscale.scaling.pmnf import CONSTANT, Term


@pytest.mark.parametrize(
    "text, term",
    [
        ("O(1)", CONSTANT),
        ("O(log n)", Term(0, 1)),
        ("O(lg n)", Term(0, 1)),
        ("O(ln(n))", Term(0, 1)),
        ("O(log2(p))", Term(0, 1)),
        ("O(log^2 n)", Term(0, 2)),
        ("O((log n)^2)", Term(0, 2)),
        ("O(log(n)^2)", Term(0, 2)),
        ("O(sqrt n)", Term(Fraction(1, 2))),
        ("O(sqrt(x))", Term(Fraction(1, 2))),
        ("O(n)", Term(1)),
        (" o( n ) ", Term(1)),
        ("O(n log n)", Term(1, 1)),
        ("O(n·log n)", Term(1, 1)),
        ("O(p*log2(p))", Term(1, 1)),
        ("O(n log n log n)", Term(1, 2)),
        ("O(n * sqrt n)", Term(Fraction(3, 2))),
        ("O(n^2)", Term(2)),
        ("O(N**2)", Term(2)),
        ("O(n^1.5)", Term(Fraction(3, 2))),
        ("O(n^(3/2) log n)", Term(Fraction(3, 2), 1)),
        ("O(n^(4/3) log^2 n)", Term(Fraction(4, 3), 2)),
        ("O(batch_size)", Term(1)),
        ("O(n^-1)", CONSTANT),
        ("O(n^(-1/2))", CONSTANT),
    ],
)
def test_parse_order(text, term):
    assert parse_order(text) == term


@pytest.mark.parametrize(
    "text, why",
    [
        ("n", "write it as O"),
        ("O()", "empty"),
        ("O(n m)", "more than one variable"),
        ("O(log)", "variable is missing"),
        ("O(log log n)", "variable is missing"),
        ("O(sqrt)", "variable is missing"),
        ("O(n^)", "cannot read"),
        ("O(n^(1/2)", "cannot read"),
        ("O(n + 1)", "cannot read '\\+ 1'"),
        ("O(2n)", "cannot read"),
        ("O(log^0.5 n)", "log power must be a positive integer"),
        ("O(log^2(n)^2)", "log power is given twice"),
        ("O(n^(1/0))", "is not an exponent"),
    ],
)
def test_parse_order_rejects_malformed_text_quoting_it(text, why):
    with pytest.raises(CropScaleError, match=re.escape(f"expected {text!r}")) as info:
        parse_order(text)
    assert re.search(why, str(info.value)), str(info.value)


@pytest.mark.parametrize("text, var", [("O(1)", None), ("O(n)", "n"), ("O(batch_size log2(batch_size))", "batch_size"),
                                       ("O(sqrt(p))", "p"), ("O(N^2)", "N")])
def test_order_variable(text, var):
    assert order_variable(text) == var
    assert order_variable(Term(1)) is None


def test_parse_order_of_a_term_is_its_order_and_other_types_are_refused():
    assert parse_order(Term(Fraction(-1))) == CONSTANT and parse_order(Term(2, 1)) == Term(2, 1)
    with pytest.raises(CropScaleError, match="expected must be a string"):
        parse_order(3)


def test_the_factor_table_documents_each_pattern():
    assert [d.split(":")[0] for d, _, _ in FACTORS] == ["log factor", "square root", "power"]


def test_ladder_has_every_polynomial_exponent_of_the_fitter_and_the_log_classes_in_increasing_order():
    texts = [t.big_o() for t in LADDER]
    assert texts == ["O(1)", "O(log n)", "O(log^2 n)", "O(n^(1/4))", "O(n^(1/3))", "O(n^(1/2))", "O(n^(2/3))",
                     "O(n^(3/4))", "O(n^(4/5))", "O(n)", "O(n log n)", "O(n log^2 n)", "O(n^(5/4))", "O(n^(4/3))",
                     "O(n^(3/2))", "O(n^(5/3))", "O(n^(7/4))", "O(n^2)", "O(n^(9/4))", "O(n^(7/3))", "O(n^(5/2))",
                     "O(n^(8/3))", "O(n^(11/4))", "O(n^3)"]
    assert list(LADDER) == sorted(LADDER)
    assert ladder_index(Term(1, 1)) == 10 and ladder_index(Term(Fraction(4, 3))) == 13
    assert ladder_index(Term(Fraction(1, 2), 1)) is None
    assert ladder_index(Term(Fraction(-1))) == 0  # bounded: O(1)


@pytest.mark.parametrize(
    "fitted, expected, factor",
    [
        (Term(1, 1), Term(1), "log n"),
        (Term(Fraction(3, 2)), Term(1, 2), "n^(1/2) / log^2 n"),
        (Term(2), CONSTANT, "n^2"),
        (Term(2, 1), Term(1), "n log n"),
        (Term(0, 2), Term(0, 1), "log n"),
        (Term(1), Term(1, 1), "1"),
        (Term(Fraction(-1)), CONSTANT, "1"),
    ],
)
def test_excess_factor(fitted, expected, factor):
    assert excess_factor(fitted, expected) == factor


def test_search_space_contains_the_expectation_and_a_class_above_it():
    on = search_space(Term(1))
    assert on == tuple(LADDER)
    off = search_space(Term(Fraction(3, 5)))
    assert Term(Fraction(3, 5)) in off and len(off) == 25 and list(off) == sorted(off)
    top = search_space(Term(3))
    assert top[-1] == Term(4)  # nothing on the ladder is above O(n^3): O(n^4) is added
    neg = search_space(CONSTANT, negative_exponents=True)
    assert {Term(Fraction(-1, 2)), Term(-1), Term(-2)} <= set(neg)
    assert all(t.j == 0 for t in search_space(Term(1), log_terms=False))
    with pytest.raises(CropScaleError, match="log factor"):
        search_space(Term(1, 1), log_terms=False)
