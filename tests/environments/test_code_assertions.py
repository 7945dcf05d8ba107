"""Assert tests split into sandbox probes and parent-side conditions; plain-value reports."""

import json
import math
import re

import pytest

from nemo_rl_core.environments.code_assertions import compile_assert_test
from nemo_rl_core.environments.code_harness import decode_plain, dump_json, encode_plain
from nemo_rl_core.environments.code_sandbox import ProbeOutcome


def judge(source: str, *values: object) -> tuple[bool, str]:
    test = compile_assert_test(source)
    return test.verdict([ProbeOutcome(value=v) for v in values])


@pytest.mark.parametrize(
    ("source", "probes", "expected_kept_out"),
    [
        ("assert add(2, 3) == 5", ("add(2, 3)",), "5"),
        ("assert 5 == add(2, 3)", ("add(2, 3)",), "5"),
        ("import math\nassert math.isclose(area(2), 12.56, rel_tol=0.001)", ("area(2)",), "12.56"),
        ("assert abs(f(0.3) - 0.5) < 1e-9", ("f(0.3)",), "0.5"),
        ("assert sorted(f([3, 1])) == [1, 3]", ("f([3, 1])",), "[1, 3]"),
        ("assert f(x).lower() == 'ab'", ("f(x).lower()",), "'ab'"),
        (
            "assert [g(i) for i in range(3)] == [0, 2, 4]",
            ("[g(i) for i in range(3)]",),
            "[0, 2, 4]",
        ),
        ("assert f(2) * 3 == 12", ("f(2) * 3",), "12"),
        ("assert is_prime(7)\nassert not is_prime(8)", ("is_prime(7)", "is_prime(8)"), ""),
    ],
)
def test_expected_values_stay_in_the_parent(source, probes, expected_kept_out):
    test = compile_assert_test(source)
    assert test.probes == probes
    if expected_kept_out:
        assert all(expected_kept_out not in probe for probe in test.probes)


def test_the_parent_judges_plain_values():
    assert judge("assert add(2, 3) == 5", 5) == (True, "passed")
    assert judge("assert add(2, 3) == 5", 4) == (False, "assertion failed: add(2, 3) == 5")
    assert judge("assert pair(1) == (1, 2)", (1, 2))[0]
    assert not judge("assert pair(1) == (1, 2)", [1, 2])[0]  # as in Python: a list is no tuple
    assert judge("import math\nassert math.isclose(area(2), 12.56, rel_tol=0.001)", 12.5664)[0]
    assert judge("assert len(f(x)) == 2 and f(x)[0] == 'a'", ["a", "b"], ["a", "b"])[0]
    assert judge("assert isinstance(f(1), int)", 1)[0]
    assert judge("assert f(1) is None", None)[0]
    assert judge("assert f'{g(1)}' == '1'", 1)[0]
    ok, why = judge("assert len(f(1)) == 1", 7)
    assert not ok and why.startswith("len(f(1)) == 1 raised TypeError")


def test_a_probe_error_fails_with_its_message():
    test = compile_assert_test("assert add(2, 3) == 5")
    outcome = ProbeOutcome(error="add(2, 3) raised ZeroDivisionError: division by zero")
    assert test.verdict([outcome]) == (False, outcome.error)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("assert all(f(i) == i for i in range(3))", "compares `f(i) == i`"),
        ("assert [5].count(f(x) == 5)", "compares"),
        ("x = f(1)\nassert x == 1", "only assert statements"),
        ("import os\nassert f(1) == 1", "only assert statements"),
        ("assert (", "not valid Python"),
        ("import math", "no assert statement"),
    ],
)
def test_unsupported_asserts_are_refused_with_the_fix(source, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        compile_assert_test(source)


def test_the_parent_cannot_be_made_to_blow_up_by_a_value():
    """``**`` and friends run in the sandbox: a huge sample value cannot stall the parent."""
    test = compile_assert_test("assert 2 ** f(1) == 8 and 'ab' * g(1) == 'abab'")
    assert test.probes == ("2 ** f(1)", "'ab' * g(1)")


@pytest.mark.parametrize(
    "value",
    [None, True, 0, -(10**40), 1.5, 1e-300, math.inf, "é\"\n\x00", b"\x00\xff", [1, (2, 3)], {1, "a"},
     frozenset({2}), {"a": [1], (1, 2): {3: None}}, (), [[[]]]],
)  # fmt: skip
def test_plain_values_round_trip_through_json(value):
    text = dump_json(encode_plain(value))
    assert json.loads(text) == json.loads(json.dumps(encode_plain(value)))
    decoded = decode_plain(json.loads(text))
    assert decoded == value and type(decoded) is type(value)
    assert math.isnan(decode_plain(encode_plain(math.nan)))


def test_values_that_are_not_plain_are_refused():
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    class LyingStr(str):
        def __str__(self):
            return "something else"

    class MyInt(int):
        pass

    for value in (AlwaysEqual(), LyingStr("x"), MyInt(3), [1, object()], {"k": print}, 1j):
        with pytest.raises(TypeError, match="is not plain"):
            encode_plain(value)
    nested: list = []
    nested.append(nested)
    with pytest.raises((ValueError, RecursionError)):
        encode_plain(nested)


@pytest.mark.parametrize(
    "report",
    [[1, 2], {"list": 3}, {"set": [{"list": []}]}, {"dict": [[1]]}, {"evil": []},
     {"list": [], "tuple": []}, {"float": "1e999"}, {"bytes": "zz"}],
)  # fmt: skip
def test_forged_reports_do_not_decode(report):
    with pytest.raises(ValueError):
        decode_plain(report)
