"""Assert tests split so that the sample computes and the parent judges.

``assert add(2, 3) == 5`` becomes a probe, ``add(2, 3)``, that the sandbox evaluates and
sends back as a plain value, and a condition, ``_probe_0 == 5``, that the parent evaluates
on that value: the expected ``5`` never enters the sandbox, and a sample that exits early,
raises ``SystemExit`` or returns an object whose ``__eq__`` always says yes fails.

The parent evaluates literals, comparisons, boolean logic, subscripts, f-strings, cheap
arithmetic (not ``*``, ``**``, ``%`` or ``<<``, which a sample's value could blow up), a
few pure built-ins (``len``, ``sorted``, ``abs``, ...) and ``math`` constants and functions.
Every other sub-expression (a call of the solution, a method call, a comprehension, a name
of the solution) is a probe. A probe may not contain a comparison, since it would run where
the sample can lie: such an assert is refused with the fix (one top-level comparison).
"""

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import CodeType, SimpleNamespace

from nemo_rl_core.environments.code_sandbox import ProbeOutcome

_FUNCTIONS = {
    f.__name__: f
    for f in (abs, all, any, bool, dict, float, frozenset, int, isinstance, len, list)
    + (max, min, round, set, sorted, str, sum, tuple)
}
_MATH_NAMES = ("ceil", "e", "fabs", "floor", "inf", "isclose", "isfinite", "isinf", "isnan", "nan")
_MATH = SimpleNamespace(**{name: getattr(math, name) for name in _MATH_NAMES + ("pi", "sqrt")})
_CHEAP_OPERATORS = (
    ast.Add,
    ast.Sub,
    ast.Div,
    ast.FloorDiv,
    ast.BitAnd,
    ast.BitOr,
    ast.BitXor,
    ast.RShift,
)
_PARENT_NODES = (
    ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BoolOp, ast.Compare,
    ast.IfExp, ast.Subscript, ast.Slice, ast.Starred, ast.JoinedStr, ast.FormattedValue,
)  # fmt: skip


@dataclass(frozen=True)
class AssertTest:
    """One assert test: the probes the sandbox evaluates and the conditions the parent checks."""

    source: str
    probes: tuple[str, ...]
    conditions: tuple[tuple[str, CodeType], ...]  # (the assert's text, its parent-side code)

    def verdict(self, outcomes: Sequence[ProbeOutcome]) -> tuple[bool, str]:
        """(passed, why) from the probes' outcomes, judged here on plain values only."""
        for outcome in outcomes:
            if outcome.error:
                return False, outcome.error[:300]
        values = {f"_probe_{k}": outcome.value for k, outcome in enumerate(outcomes)}
        for text, code in self.conditions:
            try:
                holds = bool(
                    eval(code, {"__builtins__": {}}, {**_FUNCTIONS, "math": _MATH, **values})
                )
            except Exception as error:  # noqa: BLE001 -- e.g. len() of an int the sample returned
                return False, f"{text} raised {type(error).__name__}: {error}"[:300]
            if not holds:
                return False, f"assertion failed: {text}"[:300]
        return True, "passed"


def compile_assert_test(source: str) -> AssertTest:
    """Split the ``assert`` statements of ``source``; ValueError saying what is not supported."""
    try:
        module = ast.parse(source)
    except SyntaxError as error:
        raise ValueError(f"is not valid Python: {error.msg} (line {error.lineno})") from None
    probes: list[str] = []
    conditions = []
    for statement in module.body:
        if isinstance(statement, ast.Import) and [a.name for a in statement.names] == ["math"]:
            continue  # the parent provides math itself
        if not isinstance(statement, ast.Assert):
            raise ValueError(
                f"may hold only assert statements (and `import math`), not `{ast.unparse(statement)}`"
            )
        text = ast.unparse(statement.test)
        body = _Splitter(probes).visit(statement.test)
        assert isinstance(body, ast.expr)  # an expression's visit returns an expression
        condition = ast.Expression(body=body)
        conditions.append((text, compile(ast.fix_missing_locations(condition), "<assert>", "eval")))
    if not conditions:
        raise ValueError("holds no assert statement")
    return AssertTest(source, tuple(probes), tuple(conditions))


class _Splitter(ast.NodeTransformer):
    """Replaces each sub-expression the parent does not evaluate by a probe placeholder."""

    def __init__(self, probes: list[str]) -> None:
        self.probes = probes

    def visit(self, node: ast.AST) -> ast.AST:
        if isinstance(node, ast.Attribute) and _is_math(node):
            return node
        if not isinstance(node, ast.expr) or _evaluated_in_parent(node):
            return self.generic_visit(node)
        for inner in ast.walk(node):
            if isinstance(inner, ast.Compare):
                raise ValueError(
                    f"compares `{ast.unparse(inner)}` inside `{ast.unparse(node)}`, which would "
                    "run in the sandbox where the sample can lie; write one comparison of a "
                    "call's result per assert, e.g. `assert f(2) == 4`"
                )
        self.probes.append(ast.unparse(node))
        placeholder = ast.Name(id=f"_probe_{len(self.probes) - 1}", ctx=ast.Load())
        return ast.copy_location(placeholder, node)


def _evaluated_in_parent(node: ast.expr) -> bool:
    if isinstance(node, _PARENT_NODES):
        return True
    if isinstance(node, ast.BinOp):
        return isinstance(node.op, _CHEAP_OPERATORS)
    if isinstance(node, ast.Name):
        return node.id in _FUNCTIONS
    if isinstance(node, ast.Call):
        function = node.func
        return (isinstance(function, ast.Name) and function.id in _FUNCTIONS) or (
            isinstance(function, ast.Attribute) and _is_math(function)
        )
    return False


def _is_math(node: ast.Attribute) -> bool:
    return (
        isinstance(node.value, ast.Name)
        and node.value.id == "math"
        and hasattr(_MATH, node.attr)
        and isinstance(node.ctx, ast.Load)
    )
