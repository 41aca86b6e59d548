"""scripts/mutate.py (make mutate) without running mutmut: the copy it mutates keeps every line where it was and
behaves as the module does; mutant names read back as the function they mutate; a module without tests is refused."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("mutate_script", REPO / "scripts" / "mutate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SOURCE = '''from typing_extensions import override


class Base:
    def f(self):
        return 1


class C(Base):
    def __init__(self, n):
        self.n = n

    @override
    def f(self):
        return self.n + 1

    @property
    def twice(self):
        return 2 * self.n

    class Inner:
        @property
        def nested(self):
            return 7


def top():
    return C(3).twice
'''


def test_the_mutated_copy_keeps_lines_and_behaviour():
    mod = _script()
    text, props = mod.make_mutable(SOURCE)
    old, new = SOURCE.splitlines(), text.splitlines()
    assert props == ["C.twice"]  # the nested class's property stays as it is (mutmut skips nested classes)
    for i, line in enumerate(old):  # every line but the rewritten decorators and the renamed def is where it was
        if line.strip() in ("@override", "@property") and "nested" not in old[i + 1]:
            assert new[i].lstrip().startswith("# @")
        elif "def twice" in line:
            assert new[i] == line.replace("def twice(", "def _mutmut_property_twice(")
        else:
            assert new[i] == line
    assert new[-1] == "C.twice = property(C._mutmut_property_twice)"
    ns_old, ns_new = {}, {}
    exec(compile(SOURCE, "old", "exec"), ns_old)
    exec(compile(text, "new", "exec"), ns_new)
    for ns in (ns_old, ns_new):
        c = ns["C"](4)
        assert (c.f(), c.twice, ns["top"](), ns["C"].Inner().nested) == (5, 8, 6, 7)
    assert isinstance(ns_new["C"].__dict__["twice"], property)


def test_mutant_names_read_back_as_functions_and_lines():
    mod = _script()
    assert mod.function_name("cropscale.numbers.x_percentile__mutmut_12") == "percentile"
    sep = mod.SEP
    assert mod.function_name(f"cropscale.a.x{sep}C{sep}_mutmut_property_twice__mutmut_1") == "C.twice"
    assert mod.function_lines(SOURCE) == {f"x{sep}Base{sep}f": 5, f"x{sep}C{sep}__init__": 10,
                                          f"x{sep}C{sep}f": 14, f"x{sep}C{sep}twice": 18, "x_top": 27}
    assert mod.slug("cropscale/callbacks/_dist.py") == "callbacks._dist"


def test_a_module_outside_the_table_needs_its_tests_named(capsys):
    mod = _script()
    assert mod.main(["cropscale/batch.py"]) == 2
    assert "no tests listed in scripts/mutate.py MODULE_TESTS (or pass --tests)" in capsys.readouterr().err
    assert mod.main(["cropscale/no_such_module.py"]) == 2
    assert "no such module under cropscale/" in capsys.readouterr().err
    assert mod.main(["--sample", "0", "cropscale/numbers.py"]) == 2
    assert "--sample takes a positive number of mutants" in capsys.readouterr().err
    for module, tests in mod.MODULE_TESTS.items():  # the table names files that exist
        assert (REPO / module).is_file(), module
        assert all((REPO / t.removeprefix("--ignore=")).exists() for t in tests), (module, tests)


def test_tests_sharing_a_module_scoped_fixture_judge_what_the_fixture_ran():
    """The fit of a module-scoped fixture runs during its first test only: its other tests are added."""
    mod = _script()
    by_function = {"m.x_fit_step": {"t.py::test_first"}, "m.x_alone": {"u.py::test_u"}}
    groups = [{"t.py::test_first", "t.py::test_second", "t.py::test_third"}, {"v.py::a", "v.py::b"}]
    assert mod.widen(by_function, groups) == 2
    assert by_function == {"m.x_fit_step": {"t.py::test_first", "t.py::test_second", "t.py::test_third"},
                           "m.x_alone": {"u.py::test_u"}}


def test_a_sample_is_the_same_draw_whatever_the_order_and_never_more_than_asked():
    m = _script()
    names = [f"m.x_f__mutmut_{i}" for i in range(1, 41)]
    first = m.draw(names, 10, seed=3)
    assert len(first) == 10 and first <= set(names)
    assert m.draw(list(reversed(names)), 10, seed=3) == first     # the order mutmut lists them in does not matter
    assert m.draw(names, 10, seed=4) != first                      # another seed, another draw
    assert m.draw(names, 99, seed=3) == set(names)                 # more than there are: all of them


def test_the_sampled_score_interval_is_clopper_pearson_worked_by_hand():
    m = _script()
    # all n killed: the exact interval is [(alpha/2)^(1/n), 1]; 15 of 15 -> 0.025^(1/15) = 0.78197
    assert m.score_interval(15, 15) == [round(100 * 0.025 ** (1 / 15), 1), 100.0] == [78.2, 100.0]
    # none killed: [0, 1 - (alpha/2)^(1/n)]; 0 of 10 -> 1 - 0.025^(1/10) = 0.30850
    assert m.score_interval(0, 10) == [0.0, round(100 * (1 - 0.025 ** (1 / 10)), 1)] == [0.0, 30.8]
    assert m.score_interval(0, 0) is None
