"""The kd package's own modules, by name: the files that the tests reading the package's source walk (the import
map, and the checks that one job is done in one place only)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "storage", "pipeline", "student", "dataset", "apps")


def modules() -> dict[str, Path]:
    """kd module name -> file, for the package's own files (tests/ and bench/ are not part of it)."""
    out = {"kd": ROOT / "__init__.py", "kd.cli": ROOT / "cli.py", "kd.__main__": ROOT / "__main__.py"}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else []:
            parts = f.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("kd", *parts[:-1])) if parts[-1] == "__init__" else ".".join(("kd", *parts))
            out[name] = f
    return out
