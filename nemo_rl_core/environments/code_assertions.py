"""Assert tests: checked here, judged where no sample can reach them (``code_judge``).

``assert add(2, 3) == 5`` is judged by evaluating ``add(2, 3) == 5`` in the judge's
sandbox, where ``add`` stands for the sample's function: calling it asks the sample's own
sandbox, which answers with a plain value. Everything else in the assert (the expected
``5``, operators, builtins, ``math``, comprehensions, method calls on returned values) is
evaluated in the judge: the sample can neither read an expected value nor shadow what
computes one, and none of its objects decides a comparison.

A test may hold only assert statements (and ``import math``; ``math`` is always there).
The names of the solution are those the asserts read that neither Python's builtins nor
``math`` define: a name a builtin answers means the builtin, wherever the test uses it.
"""

import ast
import builtins
from dataclasses import dataclass

_PROVIDED = frozenset(dir(builtins)) | {"math"}


@dataclass(frozen=True)
class AssertTest:
    """One assert test: the solution's names it reads, and each assert's condition."""

    source: str
    names: tuple[str, ...]
    asserts: tuple[tuple[str, str], ...]  # (the assert's text as written, its condition's source)


def compile_assert_test(source: str) -> AssertTest:
    """Check the ``assert`` statements of ``source``; ValueError saying what is not supported."""
    try:
        module = ast.parse(source)
    except SyntaxError as error:
        raise ValueError(f"is not valid Python: {error.msg} (line {error.lineno})") from None
    conditions = []
    for statement in module.body:
        if isinstance(statement, ast.Import) and [a.name for a in statement.names] == ["math"]:
            continue  # the judge provides math itself
        if not isinstance(statement, ast.Assert):
            raise ValueError(
                f"may hold only assert statements (and `import math`), not `{ast.unparse(statement)}`"
            )
        conditions.append(statement.test)
    if not conditions:
        raise ValueError("holds no assert statement")
    asserts = tuple(
        (
            ast.get_source_segment(source, condition) or ast.unparse(condition),
            ast.unparse(condition),
        )
        for condition in conditions
    )
    return AssertTest(source, _solution_names(conditions), asserts)


def _solution_names(conditions: list[ast.expr]) -> tuple[str, ...]:
    """Names read and not bound inside the conditions (comprehension targets, lambda
    arguments, walrus targets), less the builtins and math."""
    read, bound = [], set()
    for node in (inner for condition in conditions for inner in ast.walk(condition)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            read.append(node.id)
        elif isinstance(node, ast.Name):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return tuple(dict.fromkeys(n for n in read if n not in bound and n not in _PROVIDED))
