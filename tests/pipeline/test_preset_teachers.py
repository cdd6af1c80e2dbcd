"""Issue 49: after `./setup.sh`, every preset's teachers resolve from an empty kd cache, with nothing else to
install (mpnet's zip parts are unpacked into the cache on this first use)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kd.apps.distill import recipe
from kd.pipeline.teacher.resolve import resolve_teacher


@pytest.fixture(scope="module")
def empty_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kd-cache")


@pytest.mark.parametrize("preset", recipe.PRESETS)
def test_every_presets_teachers_resolve_from_an_empty_cache(preset, empty_cache, monkeypatch):
    monkeypatch.setenv("KD_CACHE", str(empty_cache))
    r = recipe.load(preset)
    for spec in filter(None, (*r.teachers, r.start)):
        folder = Path(resolve_teacher(spec).path)
        assert (folder / "config.json").is_file(), (preset, spec, folder)
        assert list(folder.glob("*.safetensors")), f"{spec}: no safetensors weights in {folder}"
        if spec == "mpnet":  # unpacked from the installed parts into this (at first empty) cache
            assert empty_cache in folder.parents
