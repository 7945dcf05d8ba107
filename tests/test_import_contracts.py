"""The import contracts of the layers: ``[tool.importlinter]`` in pyproject.toml (the config
package is a leaf, the algorithms sit below the pipeline, ``nemo_rl_core`` never imports
Prefect, ``tasks`` or ``flows``, ``tasks`` never imports ``flows``), and no import circle
between modules of ``nemo_rl_core``, ``tasks`` and ``flows``: an import inside a function
counts (it runs); one under ``if TYPE_CHECKING:`` does not (it never runs).

``python tests/test_import_contracts.py`` prints the circles, type-only imports counted and
not, of the checkout it runs from.
"""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest
from importlinter.cli import lint_imports

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("nemo_rl_core", "tasks", "flows")


def import_circles(
    packages: tuple[str, ...] = PACKAGES, type_only_count: bool = False
) -> list[list[str]]:
    """Each set of two or more modules of ``packages`` that import one another round a
    circle (the strongly connected components of the import graph), sorted."""
    graph = grimp.build_graph(
        *packages, exclude_type_checking_imports=not type_only_count, cache_dir=None
    )
    return sorted(
        sorted(component) for component in _strongly_connected(graph) if len(component) > 1
    )


def _strongly_connected(graph: grimp.ImportGraph) -> Iterator[set[str]]:
    """Tarjan's algorithm, iterative (a deep import chain must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    imported = sorted(graph.find_modules_directly_imported_by(target))
                    work.append((target, iter(imported)))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == module:
                        break
                yield component


def test_the_layer_contracts_hold(capsys: pytest.CaptureFixture[str]) -> None:
    code = lint_imports(str(REPO / "pyproject.toml"), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out


def test_no_module_imports_itself_round_a_circle() -> None:
    circles = import_circles()
    assert circles == [], "import circles (break each by moving the shared part down):\n" + (
        "\n".join(" <-> ".join(circle) for circle in circles)
    )


def test_a_circle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk finds a circle that runs through a function's import, and counts a
    type-only import only when asked."""
    package = tmp_path / "circle_probe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circle_probe import b\n")
    (package / "b.py").write_text("def f():\n    from circle_probe import c\n")
    (package / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from circle_probe import a\n"
        "from circle_probe import b\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_circles(("circle_probe",)) == [["circle_probe.b", "circle_probe.c"]]
    assert import_circles(("circle_probe",), type_only_count=True) == [
        ["circle_probe.a", "circle_probe.b", "circle_probe.c"]
    ]


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    for counted in (False, True):
        found = import_circles(type_only_count=counted)
        label = "with type-only imports" if counted else "imports that run"
        sizes = [len(circle) for circle in found]
        print(f"{label}: {len(found)} circles, sizes {sizes}")
        for circle in found:
            print("   ", " <-> ".join(circle))
