"""The teacher is paid once in evaluation too (apps/eval/cache.py), and a collapsed student is flagged."""

from __future__ import annotations

import io
import json
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import build_tiny_bert
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)

import kd.apps.eval.models as eval_models
import kd.apps.eval.run as kd_eval
from kd.apps.eval import metrics, tasks
from kd.apps.eval.cache import TeacherCache
from kd.apps.eval.models import EvalModel, Kind, Loaded, teacher_model
from kd.apps.eval.run import EvalConfig, Measure, evaluate

pytestmark = pytest.mark.filterwarnings("ignore:An input array is constant")  # the zeroed stub's STS is undefined
PAIRS = 40
MEASURES = [Measure.sts, Measure.probe, Measure.agreement, Measure.neighbours, Measure.speed]


@pytest.fixture(autouse=True)
def kd_cache(tmp_path, monkeypatch) -> Path:
    """Each test starts with an empty kd cache folder of its own."""
    monkeypatch.setenv("KD_CACHE", str(tmp_path / "kd-cache"))
    return tmp_path / "kd-cache"


@pytest.fixture
def loads(monkeypatch) -> list[str]:
    """Every teacher load of an evaluation, counted (apps.eval.models.teacher_model calls load_teacher)."""
    seen: list[str] = []
    real = eval_models.load_teacher

    def counted(spec, *args, **kwargs):
        seen.append(str(spec))
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(eval_models, "load_teacher", counted)
    return seen


def _cfg(teacher: Path, **kw) -> EvalConfig:
    opts = dict(teacher=f"tiny={teacher}", target="mean", measures=MEASURES, max_pairs=PAIRS,
                agreement_rows=120, k=5, speed_b1=4, speed_big=32, baseline=False, progress=False)
    return EvalConfig(**(opts | kw))


def _no_model_load(monkeypatch) -> None:
    from transformers import PreTrainedModel

    def refuse(*_a, **_k):
        raise AssertionError("the teacher's weights were loaded")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refuse))


def _sts_texts() -> list[str]:
    task = tasks.load_stsb("dev").head(PAIRS)
    return task.a + task.b


def test_a_second_call_loads_no_teacher_and_gives_the_same_numbers(tiny_teacher, loads, monkeypatch):
    first = evaluate(_cfg(tiny_teacher))
    assert len(loads) == 1
    assert all(first.info[m].endswith("from the model") for m in ("sts", "probe"))
    _no_model_load(monkeypatch)
    second = evaluate(_cfg(tiny_teacher))
    assert len(loads) == 1  # neither vectors nor speed needed the teacher
    assert all(second.info[m].endswith("from the cache") for m in ("sts", "probe"))
    assert "from the cache" in second.info["agreement"] and "timed by an earlier call" in second.info["speed"]
    assert second.models[0].metrics == first.models[0].metrics
    assert np.array_equal(second.sts_sims["tiny"], first.sts_sims["tiny"])


def test_cached_vectors_equal_fresh_ones_exactly(tiny_teacher, loads):
    evaluate(_cfg(tiny_teacher, measures=[Measure.sts]))
    texts = _sts_texts()
    cached = TeacherCache(f"tiny={tiny_teacher}", "mean").vectors(texts)
    fresh = teacher_model(f"tiny={tiny_teacher}", "mean").encode(texts)
    assert cached is not None and cached.dtype == np.float32 and np.array_equal(cached, fresh)


def test_no_cache_runs_the_teacher_and_writes_nothing(tiny_teacher, loads, kd_cache):
    evaluate(_cfg(tiny_teacher, measures=[Measure.sts, Measure.speed]))
    again = evaluate(_cfg(tiny_teacher, measures=[Measure.sts, Measure.speed], cache=False))
    assert len(loads) == 2 and again.info["sts"].endswith("from the model")
    assert "earlier call" not in again.info["speed"]
    before = sorted(p.name for p in (kd_cache / "eval").iterdir())
    evaluate(_cfg(tiny_teacher, measures=[Measure.sts], max_pairs=PAIRS - 1, cache=False))
    assert sorted(p.name for p in (kd_cache / "eval").iterdir()) == before


def test_another_set_output_or_teacher_misses_the_cache(tiny_teacher, tmp_path, loads):
    evaluate(_cfg(tiny_teacher, measures=[Measure.sts]))
    texts = _sts_texts()
    spec = f"tiny={tiny_teacher}"
    assert TeacherCache(spec, "mean").vectors(texts) is not None
    assert TeacherCache(spec, "mean").vectors(texts[:-1]) is None  # another evaluation set
    assert TeacherCache(spec, "mean").vectors([*texts[1:], texts[0]]) is None  # same texts, other order
    assert TeacherCache(spec, "cls").vectors(texts) is None  # another output
    other = build_tiny_bert(tmp_path / "other-bert", seed=1)  # same config and tokenizer, other weights
    assert TeacherCache(f"tiny={other}", "mean").vectors(texts) is None
    got = evaluate(_cfg(other, measures=[Measure.sts]))
    assert got.info["sts"].endswith("from the model") and len(loads) == 2
    assert evaluate(_cfg(tiny_teacher, measures=[Measure.sts], max_pairs=PAIRS - 5)).info["sts"].endswith("model")


@pytest.mark.parametrize("damage", ["flip a vector byte", "truncate", "garbage"])
def test_a_damaged_entry_is_recomputed_never_trusted(tiny_teacher, loads, kd_cache, damage):
    first = evaluate(_cfg(tiny_teacher, measures=[Measure.sts]))
    (entry,) = (kd_cache / "eval").glob("vectors-*.safetensors")
    data = bytearray(entry.read_bytes())
    if damage == "flip a vector byte":
        data[-3] ^= 0x40
    entry.write_bytes(bytes(data[: len(data) // 2]) if damage == "truncate" else
                      b"not a safetensors file" if damage == "garbage" else bytes(data))
    assert TeacherCache(f"tiny={tiny_teacher}", "mean").vectors(_sts_texts()) is None
    again = evaluate(_cfg(tiny_teacher, measures=[Measure.sts]))
    assert again.info["sts"].endswith("from the model") and len(loads) == 2
    assert np.array_equal(again.sts_sims["tiny"], first.sts_sims["tiny"])
    third = evaluate(_cfg(tiny_teacher, measures=[Measure.sts]))  # the entry was rewritten whole
    assert third.info["sts"].endswith("from the cache") and len(loads) == 2


# --- collapsed students -------------------------------------------------------------------------------

def _hashed(text: str, dim: int = 16) -> np.ndarray:
    return np.random.default_rng(zlib.crc32(text.encode())).standard_normal(dim).astype(np.float32)


STUBS = {  # name -> encoder: texts -> vectors
    "healthy": lambda texts: np.stack([_hashed(t) for t in texts]),
    # every text near one vector, so every STS pair sits at cosine ~1.0 (the BiLSTM a user reported)
    "flat": lambda texts: np.stack([np.ones(16, np.float32) + 1e-3 * _hashed(t) for t in texts]),
    "zeroed": lambda texts: np.zeros((len(texts), 16), np.float32),  # weights zeroed: one vector for all
}


@pytest.fixture
def stub_report(tiny_teacher, tmp_path, monkeypatch):
    def stub(folder, name=None):
        name = name or Path(folder).name
        return EvalModel(name, Kind.student, lambda: Loaded(STUBS[Path(folder).name], None, []))

    monkeypatch.setattr(kd_eval, "student_model", stub)
    folders = [tmp_path / n for n in STUBS]
    for f in folders:
        f.mkdir()
    cfg = _cfg(tiny_teacher, students=[str(f) for f in folders], measures=[Measure.sts, Measure.agreement],
               json_path=str(tmp_path / "r.json"), markdown_path=str(tmp_path / "r.md"))
    return evaluate(cfg), tmp_path


def test_a_collapsed_student_is_flagged_in_the_json_and_the_table(stub_report):
    report, root = stub_report
    by_name = {m["name"]: m for m in json.loads((root / "r.json").read_text())["models"]}
    assert by_name["tiny"]["collapsed"] is None and by_name["healthy"]["collapsed"] is None
    assert by_name["flat"]["collapsed"].startswith("cos spread 0.0")
    assert by_name["flat"]["metrics"]["sts_spearman"] is not None  # a number that looks fine on its own
    assert by_name["zeroed"]["collapsed"].startswith("cos spread 0.000")
    md = {ln.split("|")[1].strip(): ln for ln in (root / "r.md").read_text().splitlines()[2:] if ln.startswith("|")}
    assert "(collapsed: cos spread" in md["flat"] and "(collapsed: cos spread" in md["zeroed"]
    assert "collapsed" not in md["healthy"] and "collapsed" not in md["tiny"]
    from rich.console import Console

    console = Console(file=io.StringIO(), width=400)
    console.print(report.rich_table())
    lines = console.file.getvalue().splitlines()
    assert any("flat" in ln and "(collapsed: cos spread" in ln for ln in lines)
    assert not any("healthy" in ln and "collapsed" in ln for ln in lines)


def test_agreement_alone_flags_near_constant_vectors(tiny_teacher, tmp_path, monkeypatch, stub_report):
    report, _ = stub_report
    flat = next(m for m in report.models if m.name == "flat")
    assert flat.collapsed is not None and flat.collapsed[0] == "sts_spearman"  # STS found it first
    texts = [f"text {i}" for i in range(300)]
    flat_spread, healthy = metrics.spread(STUBS["flat"](texts)), metrics.spread(STUBS["healthy"](texts))
    assert metrics.collapse(flat_spread).startswith("mean cos ")
    assert metrics.collapse(healthy) is None
    assert metrics.collapse(flat_spread, flat_spread) is None  # as narrow as its teacher: a faithful copy
    assert metrics.collapse(flat_spread, healthy).endswith(f"(teacher {healthy.mean_cos:.3f})")
    only = evaluate(_cfg(tiny_teacher, students=[str(tmp_path / "flat")], measures=[Measure.agreement]))
    assert only.models[1].collapsed[0] == "cos_to_teacher" and only.models[1].collapsed[1].startswith("mean cos")


def test_cli_no_cache_runs_the_teacher_again(tiny_teacher, loads):
    from typer.testing import CliRunner

    from kd.cli import app

    args = ["eval", "--teacher", f"tiny={tiny_teacher}", "--target", "mean", "--task", "sts", "--max-pairs", "20",
            "--no-baseline", "--no-progress"]
    assert "from the model" in CliRunner().invoke(app, args).output
    assert "from the cache" in CliRunner().invoke(app, args).output and len(loads) == 1
    res = CliRunner().invoke(app, [*args, "--no-cache"])
    assert res.exit_code == 0 and "from the model" in res.output and len(loads) == 2
