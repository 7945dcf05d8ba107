"""Storage owns the manifest: no module outside ``nemo_rl_core/storage`` spells its keys or
reaches into the storage classes' private members; they read the typed records instead."""

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STORAGE = ROOT / "nemo_rl_core" / "storage"
PACKAGES = ("nemo_rl_core", "tasks", "flows", "bench")
# What a manifest and its stage entries hold (``manifest.py``).
MANIFEST_KEYS = {"stages", "repairs", "status", "inputs", "outputs", "metrics", "finished_at"}
MANIFEST_KEYS |= {"ran_on"}
RUN_STORAGE_CLASSES = {"RunStorage", "ObjectStore", "ManifestStore", "CheckpointStore"}
# The same word for something else: (module, key) -> what it is there.
OTHER_MEANINGS = {
    ("nemo_rl_core/environments/code_sandbox.py", "status"): "bubblewrap's status pipe",
}


def _modules(*tops: str) -> Iterator[Path]:
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            if not path.is_relative_to(STORAGE):
                yield path


def _spelled_keys(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """String keys used to take a mapping apart: ``x["k"]``, ``x.get("k")``, ``"k" in x``."""
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault", "pop")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            key = node.args[0].value
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Constant)
            and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
        ):
            key = node.left.value
        if isinstance(key, str):
            yield node.lineno, key


def test_no_module_outside_storage_reads_the_manifest_keys() -> None:
    found = []
    for path in _modules(*PACKAGES):
        module = path.relative_to(ROOT).as_posix()
        for line, key in _spelled_keys(ast.parse(path.read_text())):
            if key in MANIFEST_KEYS and (module, key) not in OTHER_MEANINGS:
                found.append(f"{module}:{line}: [{key!r}]")
    assert found == [], (
        "read the typed records of nemo_rl_core/storage/manifest.py (read_manifest, "
        f"completed_stage, read_stage_run) instead of the stored keys: {found}"
    )


def _storage_privates() -> set[str]:
    """The private methods and attributes the run storage's front and sections define
    (``_update_manifest``, ``_manifest_seen``, ...)."""
    names = set()
    for path in STORAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name in RUN_STORAGE_CLASSES:
                for member in ast.walk(node):
                    if isinstance(member, ast.FunctionDef) and member.name.startswith("_"):
                        names.add(member.name)
                    if (
                        isinstance(member, ast.Attribute)
                        and isinstance(member.ctx, ast.Store)
                        and member.attr.startswith("_")
                    ):
                        names.add(member.attr)  # ``self._seen = ...``
    return {name for name in names if not name.startswith("__")}


def test_no_module_outside_storage_uses_its_private_members() -> None:
    privates = _storage_privates()
    assert {"_update_manifest", "_known_manifest", "_check_lease"} <= privates
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}"
        for path in _modules(*PACKAGES, "tests")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in privates
        if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]
    assert found == [], f"use storage's public calls (fault injection: tasks/faults.py): {found}"
