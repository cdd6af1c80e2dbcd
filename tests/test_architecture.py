"""The package map of docs/design.md, enforced: which kd package may import which, and no import cycles.

- Every `import kd...` / `from kd... import` in every module of the package is an edge, wherever it
  stands: at the top or inside a function (a lazy import). A lazy import hides a cycle
  from Python's import system, not from the design.
- `from kd.a import b` is an edge to the module kd.a.b when that file exists, else to kd.a.
- Imports under `if TYPE_CHECKING:` (annotations only) obey the layers but never count as a cycle: they
  never run.
- Layers, bottom to top: common -> storage -> {pipeline, student} (siblings, never each other) -> dataset
  -> apps -> cli. A module imports only its own layer and the ones below; dataset (DuckDB views, faiss,
  clustering) sits above the store contract and is never imported by storage, pipeline or student.
- Inside apps/ and pipeline/, a sub-package imports only the rooms SUBPACKAGE_IMPORTS lists.

The tests obey a rule of their own: no file under tests/ imports a test_* module. What two test files share
lives in conftest.py or in a helpers module (tests/*.py not named test_*).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

from package_modules import PACKAGES, ROOT, modules

# what each top-level part may import (besides itself)
ALLOWED = {
    "kd": {"apps"},  # kd.precompute / kd.train_student (kd.apps.api), loaded on first use
    "common": set(),
    "storage": {"common"},
    "pipeline": {"common", "storage"},
    "student": {"common", "storage"},
    "dataset": {"common", "storage"},
    "apps": {"common", "storage", "pipeline", "student", "dataset"},
    "cli": {"common", "storage", "pipeline", "student", "dataset", "apps"},
    "__main__": {"cli"},
}


def _type_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (annotations only: never run)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def imports(file: Path, known: set[str], type_only: bool = True) -> set[str]:
    """The kd modules `file` imports, lazy ones included; `type_only=False` leaves out the imports under
    `if TYPE_CHECKING:`, which never run and so cannot take part in an import cycle."""
    found = set()
    tree = ast.parse(file.read_text(encoding="utf-8"))
    skip = set() if type_only else _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name == "kd" or a.name.startswith("kd.")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "kd":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in known else node.module)
    return {m for m in found if m in known}


def graph(type_only: bool = True) -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(f, set(mods), type_only) - {name} for name, f in mods.items()}


def part(module: str) -> str:
    """The top-level part a module belongs to: kd, cli, __main__, or one of package_modules.PACKAGES."""
    return module.split(".")[1] if "." in module else "kd"


def test_every_import_points_down_the_layers():
    wrong = [f"{m} -> {d}" for m, deps in graph().items() for d in sorted(deps)
             if part(d) != part(m) and part(d) not in ALLOWED[part(m)]]
    assert not wrong, "imports against the package map (docs/design.md):\n" + "\n".join(wrong)


def test_no_import_cycles_even_lazy_ones():
    g = graph(type_only=False)
    try:
        graphlib.TopologicalSorter(g).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle: {' -> '.join(e.args[1])}") from None


def test_the_checks_see_lazy_imports_and_cycles(tmp_path):
    """The walker finds an import inside a function, and the cycle check fires on a planted cycle."""
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kd.apps.eval.run\n"
                 "def f():\n    from kd.storage import fs\n    import kd.pipeline.engines.plan\n")
    known = {"kd.storage", "kd.storage.fs", "kd.pipeline.engines.plan", "kd.apps.eval.run"}
    assert imports(f, known) == {"kd.storage.fs", "kd.pipeline.engines.plan", "kd.apps.eval.run"}
    assert imports(f, known, type_only=False) == {"kd.storage.fs", "kd.pipeline.engines.plan"}
    try:
        graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).prepare()
    except graphlib.CycleError:
        return
    raise AssertionError("graphlib did not report the cycle")


def test_storage_holds_the_store_contract_only():
    """The dataset side (DuckDB views, faiss search, clustering) lives in kd.dataset, not in the contract."""
    contract = {"fs", "manifest", "schema", "store", "validate", "repair", "names", "info", "tokenizer_files", "int8",
                "index_files", "faiss_layout", "alignment", "soundness",
                "info_config", "validate_config"}  # kd info's and kd validate's options (light: kd --help)
    have = {f.stem for f in (ROOT / "storage").glob("*.py")} - {"__init__"}
    assert have == contract, f"storage/ holds {sorted(have - contract)} beyond the store contract"


# Inside apps/ and pipeline/, rooms: each sub-package, and each module at the part's top. A sub-package imports only
# the rooms listed here (besides itself and the layers below its part); the rooms of one part form no cycle.
SUBPACKAGE_IMPORTS = {
    "apps.eval": set(),  # the models compared, the tasks and their measures: below every workflow
    "apps.distill": {"apps.eval", "apps.leakage"},  # a run evaluates, and trains without the leaked rows
    "apps.demo": {"apps.eval"},
    "pipeline.teacher": set(),  # a teacher and the loop that runs it over texts: below how and where it runs
    "pipeline.backends": {"pipeline.teacher"},  # the graphs a teacher runs as
    "pipeline.engines": {"pipeline.teacher", "pipeline.backends", "pipeline.job", "pipeline.grow", "pipeline.reuse",
                         "pipeline.rows"},  # who encodes a precompute's shards, from its checked job
}


def room(module: str) -> str | None:
    """'apps.eval' for kd.apps.eval.run, 'apps.leakage' for kd.apps.leakage; None outside apps/ and pipeline/."""
    parts = module.split(".")
    return ".".join(parts[1:3]) if len(parts) >= 3 and parts[1] in ("apps", "pipeline") else None


def room_graph() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for m, deps in graph(type_only=False).items():
        here = room(m)
        if here is not None:
            rooms.setdefault(here, set()).update(r for d in deps if (r := room(d)) not in (None, here)
                                                 and r.split(".")[0] == here.split(".")[0])
    return rooms


def test_sub_packages_import_only_the_rooms_they_sit_above():
    rooms = room_graph()
    wrong = [f"{r} -> {d}" for r, allowed in SUBPACKAGE_IMPORTS.items() for d in sorted(rooms.get(r, set()) - allowed)]
    assert not wrong, "a sub-package imports a room the map does not let it (docs/design.md):\n" + "\n".join(wrong)
    subs = {f"{f.parent.parent.name}.{f.parent.name}" for part in ("apps", "pipeline")
            for f in (ROOT / part).glob("*/__init__.py")}
    assert subs == set(SUBPACKAGE_IMPORTS), f"sub-packages without a rule: {sorted(subs ^ set(SUBPACKAGE_IMPORTS))}"


def test_the_rooms_of_a_part_form_no_cycle():
    try:
        graphlib.TopologicalSorter(room_graph()).prepare()
    except graphlib.CycleError as e:
        raise AssertionError(f"rooms in a cycle: {' -> '.join(e.args[1])}") from None


def test_no_room_is_named_by_prefix():
    """A part's top holds no module named after one of its sub-packages (eval_cache beside eval/), and no prefix
    names more than two modules (a command and its options, e.g. search and search_config): three are a room."""
    for part in ("apps", "pipeline"):
        subs = {f.parent.name for f in (ROOT / part).glob("*/__init__.py")}
        tops = [f.stem for f in (ROOT / part).glob("*.py") if f.stem != "__init__"]
        assert not [t for t in tops if t.split("_")[0] in subs], f"{part}/ modules named after a sub-package"
        prefixes = [t.split("_")[0] for t in tops]
        crowded = sorted({p for p in prefixes if prefixes.count(p) > 2})
        assert not crowded, f"{part}/ modules sharing a prefix, a room to be: {crowded}"


# tests/ mirrors the package: a test of kd.<part> lives in tests/<part>/; at the top, the checks of the repository as a
# whole (this map, the options declared once, the README's commands, the wheel)
WHOLE_REPO_TESTS = {"test_architecture.py", "test_options_declared_once.py", "test_readme.py", "test_wheel.py"}


def test_tests_live_in_folders_mirroring_the_package():
    rooms = {*PACKAGES, "cli"}
    misplaced = [f.relative_to(ROOT).as_posix() for f in sorted((ROOT / "tests").rglob("test_*.py"))
                 if not (f.parent.name in rooms and f.parent.parent == ROOT / "tests")
                 and not (f.parent == ROOT / "tests" and f.name in WHOLE_REPO_TESTS)]
    assert not misplaced, "move these to tests/<the part of kd they test>/:\n" + "\n".join(misplaced)


def imported_test_modules(file: Path) -> set[str]:
    """The test_* modules `file` imports, wherever the import stands (lazy ones too): `import test_x`,
    `from test_x import y`, `from . import test_x`."""
    found = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= {node.module} if node.module else {a.name for a in node.names}
    return {m for m in found if m.split(".")[0].startswith("test_")}


def test_no_test_file_imports_another():
    """Helper modules included. A test file imported by another becomes an API nobody sees as one: a change made
    for its own tests breaks the importer's, and the importer runs its module code."""
    wrong = [f"{f.name} imports {m}" for f in sorted((ROOT / "tests").rglob("*.py"))
             for m in sorted(imported_test_modules(f))]
    assert not wrong, "move what they share into conftest.py or a helpers module:\n" + "\n".join(wrong)


def test_the_test_import_check_sees_every_form(tmp_path):
    """Every form of the import is found, a lazy one too, and no other module is taken for a test module."""
    f = tmp_path / "test_m.py"
    f.write_text("import test_a\nfrom test_b import x\nfrom . import test_c\nimport testing, store_forgery\n"
                 "from single_thread import one_thread\ndef f():\n    import test_d.sub\n")
    assert imported_test_modules(f) == {"test_a", "test_b", "test_c", "test_d.sub"}


def _cli_start_modules() -> set[str]:
    """The kd modules `import kd.cli` loads: what `kd --help` and every command pay before their own work."""
    import json
    import subprocess
    import sys

    code = "import sys, json, kd.cli; print(json.dumps(sorted(m for m in sys.modules if m.startswith('kd'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


# Libraries a function may import where it needs them without a note: each costs >= 0.1 s to import alone (seconds:
# `python -c "import time; t = time.perf_counter(); import M; print(time.perf_counter() - t)"`, median of 3 fresh
# processes, 2026-11-29, AMD EPYC, 2 cores, the machine loaded 1.5) or is an extra a plain install lacks (None).
# safetensors itself costs 2 ms: its numpy and torch flavours cost numpy and torch; pyarrow's dataset and compute
# cost 0.33 s and 0.05 s past pyarrow.
HEAVY = {"torch": 1.63, "transformers": 0.89, "sentence_transformers": 7.87, "sklearn": 1.38, "scipy": 0.34,
         "spacy": 3.41, "nncf": 2.88, "openvino": 0.31, "onnx": 0.21, "onnxruntime": 0.17, "ray": 0.67, "faiss": 0.16,
         "matplotlib": 0.24, "pyarrow": 0.17, "pyarrow.compute": 0.19, "pyarrow.dataset": 0.55,
         "safetensors.numpy": 0.13, "safetensors.torch": 2.18,
         "huggingface_hub.errors": 0.14, "model2vec": None}


def _heavy(module: str) -> str | None:
    """The HEAVY entry `module` is (or is part of; the longest), or None."""
    return max((h for h in HEAVY if module == h or module.startswith(h + ".")), key=len, default=None)


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]


def unexplained_lazy_imports(file: Path) -> list[int]:
    """Lines of imports inside a function of `file` that stand there unexplained: with no `# lazy: <why>` on their
    line or the line above, and not of a HEAVY library, or of one the module already imports at its top."""
    lines = file.read_text(encoding="utf-8").splitlines()
    tree = ast.parse("\n".join(lines))
    at_top = {_heavy(m) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom) for m in _imported(node)}
    wrong = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Import | ast.ImportFrom) or getattr(node, "level", 0):
                continue
            heavy = {_heavy(m) for m in _imported(node)}
            if None not in heavy and not heavy & at_top:
                continue  # a library that costs its import, kept out of the module's own import
            if not any("# lazy:" in lines[i] for i in (node.lineno - 2, node.end_lineno - 1) if i >= 0):
                wrong.append(node.lineno)
    return sorted(set(wrong))


def test_an_import_stands_at_the_top_unless_its_cost_says_why():
    """What a module depends on is read at its top (issue 52). An import inside a function is kept only where it
    keeps a library out of an import that runs without it: in the modules `kd --help` loads (no torch, numpy or
    pyarrow there), for a HEAVY library the module does not import at its top, and elsewhere with
    `# lazy: <the library, and who runs without it>`, measured by importing each module alone (docs/design.md,
    "Imports at the top")."""
    light = _cli_start_modules()
    wrong = [f"{name.replace('.', '/')[3:]}.py:{line}" for name, f in modules().items() if name not in light
             for line in unexplained_lazy_imports(f)]
    assert not wrong, "move these imports to the module's top, or say with `# lazy:` what they keep out:\n" + \
        "\n".join(wrong)


def test_the_lazy_import_check_sees_a_bare_one_and_accepts_a_reason(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def a():\n    from kd.storage.store import Store\n\n\ndef b():\n    # lazy: pyarrow\n"
                 "    from kd.storage.store import Store\n\n\ndef c():\n    from kd.x import y  # lazy: torch\n")
    assert unexplained_lazy_imports(f) == [2]


def test_the_lazy_import_check_takes_a_heavy_library_once_and_a_light_one_never(tmp_path):
    """torch inside a function is fine where the module does not import it at its top; a second torch import where
    it does, and a light library (json, tokenizers, safetensors itself) inside a function, are not."""
    f = tmp_path / "m.py"
    f.write_text("import json\n\n\ndef a():\n    import torch.distributed as dist\n    from safetensors.torch import"
                 " load_file\n    import tokenizers\n    from safetensors import safe_open\n    import json\n")
    assert unexplained_lazy_imports(f) == [7, 8, 9]
    f.write_text("import torch\n\n\ndef a():\n    import torch.distributed as dist\n    import scipy.stats\n")
    assert unexplained_lazy_imports(f) == [5]
