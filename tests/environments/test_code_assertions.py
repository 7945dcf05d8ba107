"""Assert tests: what they may hold and which names they read; plain values round trip."""

import json
import math
import re

import pytest

from nemo_rl_core.environments.code_assertions import compile_assert_test
from nemo_rl_core.environments.code_plain import decode_plain, dump_json, encode_plain


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("assert add(2, 3) == 5", ("add",)),
        ("import math\nassert math.isclose(area(2), 12.56, rel_tol=0.001)", ("area",)),
        ("assert sorted(f([3, 1])) == [1, 3]", ("f",)),
        ("assert all(f(i) == i for i in range(3))", ("f",)),
        ("assert [g(x) for x in xs] == [0, 2]", ("g", "xs")),
        ("assert (n := f(1)) == 1 and n > 0", ("f",)),
        ("assert apply(lambda v: v + 1, 2) == 3", ("apply",)),
        ("assert Solution().two_sum([2, 7], 9) == [0, 1]", ("Solution",)),
        ("assert is_prime(7)\nassert not is_prime(8)", ("is_prime",)),
    ],
)
def test_the_names_of_the_solution_are_those_no_builtin_defines(source, names):
    test = compile_assert_test(source)
    assert test.names == names
    assert [text for text, _ in test.asserts] == [
        line.removeprefix("assert ") for line in source.splitlines() if line.startswith("assert")
    ]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x = f(1)\nassert x == 1", "only assert statements"),
        ("import os\nassert f(1) == 1", "only assert statements"),
        ("assert (", "not valid Python"),
        ("import math", "no assert statement"),
    ],
)
def test_unsupported_asserts_are_refused_with_the_fix(source, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        compile_assert_test(source)


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


def test_references_decode_only_where_they_can_be_resolved():
    objects = [print]
    assert decode_plain({"list": [{"ref": 0}]}, resolve=objects.__getitem__) == [print]
    with pytest.raises(ValueError):
        decode_plain({"list": [{"ref": 0}]})  # the judge never takes a reference for a value
    assert encode_plain([print], refer=lambda value: {"ref": 0}) == {"list": [{"ref": 0}]}


@pytest.mark.parametrize(
    "report",
    [[1, 2], {"list": 3}, {"set": [{"list": []}]}, {"dict": [[1]]}, {"evil": []},
     {"list": [], "tuple": []}, {"float": "1e999"}, {"bytes": "zz"}],
)  # fmt: skip
def test_forged_reports_do_not_decode(report):
    with pytest.raises(ValueError):
        decode_plain(report)
