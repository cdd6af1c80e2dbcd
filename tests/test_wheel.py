"""Installed, not cloned: the wheel installed outside the repository runs `kd demo --quick` in an empty
folder with no ../shared beside it and no KD_SHARED.

The wheel's dependencies are the ones this test's interpreter already has (a `.pth` line adds its
site-packages to a fresh venv, without the editable install of the repository); kd itself comes only
from the wheel, so missing package data or a module left out of the wheel fails here.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _fresh_venv(base: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base / "venv")], check=True)
    py = base / "venv" / "bin" / "python"
    target = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    # A plain path line: its folder goes on sys.path but its own .pth files (the editable kd) do not run.
    Path(target, "deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return py


def _top_level_names(wheel: Path) -> set[str]:
    """The import names a wheel adds at the top of site-packages (its files outside .dist-info / .data)."""
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/", 1)[0] for n in z.namelist()}
    return {t.removesuffix(".py") for t in tops if not t.endswith((".dist-info", ".data"))}


@pytest.mark.slow
def test_wheel_runs_the_quick_demo_without_shared_data(tmp_path):
    dist, src = tmp_path / "dist", tmp_path / "src"
    # Build from a copy of the tracked files: setuptools writes build/ into the source folder.
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(src)], check=True)
    wheel = next(dist.glob("kd-*.whl"))
    py = _fresh_venv(tmp_path)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True)
    work = tmp_path / "empty" / "work"  # no ../shared beside it
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("KD_SHARED", "PYTHONPATH")}
    env["KD_CACHE"] = str(tmp_path / "cache")
    where = subprocess.run([str(py), "-c", "import kd.cli, kd.apps; print(kd.cli.__file__)"], cwd=work, env=env,
                           check=True, capture_output=True, text=True).stdout
    assert str(ROOT) not in where and "site-packages" in where  # kd from the wheel, not the clone
    assert _top_level_names(wheel) == {"kd"}  # nothing else lands at the top of site-packages
    for name in ("cli", "pipeline", "student", "storage", "apps"):  # the old generic names are gone
        gone = subprocess.run([str(py), "-c", f"import {name}"], cwd=work, env=env, capture_output=True, text=True)
        assert gone.returncode != 0, name
    kd = py.parent / "kd"
    res = subprocess.run([str(kd), "demo", "--quick", "--no-progress", "--threads", "1"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    report = json.loads((work / "kd-demo-quick" / "report.json").read_text())  # (--quick: its own folder)
    rows = {m["name"]: m["metrics"] for m in report["models"]}
    assert rows["minilm"]["sts_spearman"] > 85  # the bundled STS-B dev pairs were found and scored
