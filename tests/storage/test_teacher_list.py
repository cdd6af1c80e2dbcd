"""`Manifest.teachers()` is the one source of a store's teacher list: no module outside storage/manifest.py reads
teacher names off the table names (a "teachers/" prefix test, a kind == "teacher" filter or a "/" split in a
loop over a manifest's tables)."""

from __future__ import annotations

import ast
from pathlib import Path

from package_modules import modules

from kd.storage.manifest import Manifest, TableRecord

OWNER = Path("storage/manifest.py")
ROOT = Path(__file__).resolve().parents[2]


def _parses_teacher_prefix(node: ast.AST) -> bool:
    """`x.startswith("teachers/")`, `x.removeprefix("teachers/")` and the like."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("startswith", "removeprefix", "split", "partition")
            and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("teachers")
                    for a in node.args))


def _picks_teachers(node: ast.AST) -> bool:
    """`rec.kind == "teacher"`, or a table name split at "/" to take its second part."""
    if isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        return any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides) and \
            any(isinstance(s, ast.Constant) and s.value == "teacher" for s in sides)
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "split"
            and ast.unparse(node.slice) == "1")


def _loops_over_tables(node: ast.AST) -> list[ast.AST]:
    """The bodies of for loops and comprehensions that iterate a manifest's tables."""
    if isinstance(node, (ast.For, ast.AsyncFor)) and "tables" in ast.unparse(node.iter):
        return [*node.body, *node.orelse]
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        gens = [g for g in node.generators if "tables" in ast.unparse(g.iter)]
        if gens:
            return [*(i for g in gens for i in g.ifs), node.elt if not isinstance(node, ast.DictComp) else node.key]
    return []


def derivations(source: str) -> list[str]:
    """Lines of `source` that derive teacher names from table names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if _parses_teacher_prefix(node):
            found.append(ast.unparse(node))
        for part in _loops_over_tables(node):
            found += [ast.unparse(n) for n in ast.walk(part) if _picks_teachers(n)]
    return found


def test_the_checker_finds_the_old_hand_written_lists():
    old = [
        'teachers = {n.split("/", 1)[1] for n in store.manifest.tables if n.startswith("teachers/")}',
        'teachers = sorted(t.split("/", 1)[1] for t, r in store.manifest.tables.items() if r.kind == "teacher")',
        'for name, rec in manifest.tables.items():\n    if rec.kind == "teacher":\n        out.append(name)',
    ]
    assert all(derivations(src) for src in old)
    assert not derivations('names = store.manifest.teachers()\nview = table.split("/", 1)[-1]')


def test_no_module_outside_the_manifest_derives_the_teacher_list():
    bad = {str(path.relative_to(ROOT)): found for path in modules().values()
           if path.relative_to(ROOT) != OWNER and (found := derivations(path.read_text(encoding="utf-8")))}
    assert not bad, f"use Manifest.teachers() instead: {bad}"


def test_teachers_by_name_and_by_column():
    m = Manifest({"fingerprint": "f", "num_shards": 1}, {
        "texts": TableRecord("texts", {"id": "int64"}),
        "teachers/a": TableRecord("teacher", {"id": "int64", "mean": "x"}),
        "teachers/b": TableRecord("teacher", {"id": "int64", "logits": "x"}),
        "students/a": TableRecord("student", {"id": "int64", "logits": "x"}),
    })
    assert m.teachers() == ["a", "b"] and m.teachers(column="logits") == ["b"]
