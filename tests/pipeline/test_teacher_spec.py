"""A --teacher is parsed once where it enters kd (`TeacherSpec`: table name + source) and travels as that value
(issue 52): its text form parses back into the same value, every command names a teacher by the one rule, and a
distill run keeps the name a user gave (NAME=FOLDER), which its string-rebuilding predecessor lost."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
from package_modules import modules

from kd.apps.distill.config import DistillConfig
from kd.apps.distill.run import _Run
from kd.apps.eval.models import teacher_model
from kd.common.errors import KdError
from kd.pipeline.backends import loading
from kd.pipeline.job import PrecomputeJob
from kd.pipeline.teacher import resolve
from kd.pipeline.teacher.resolve import TeacherRef, TeacherSpec, parse_teacher, resolve_teacher
from kd.student.target import column_key, key_parts

GIVEN = ["minilm", "mpnet", "bert-base", "bert-base-uncased", "/data/ckpt/My Model/", "x=/data/ckpt/b",
         "teacher=/data/b", "mine=minilm", "sentence-transformers/all-MiniLM-L6-v2"]


@pytest.mark.parametrize("text", GIVEN)
@pytest.mark.parametrize("unnamed", [None, "teacher", "start"])
def test_a_spec_s_text_parses_back_into_the_same_spec(text, unnamed):
    spec = parse_teacher(text, unnamed)
    assert parse_teacher(str(spec)) == spec
    assert parse_teacher(spec) is spec


def test_the_one_naming_rule():
    assert parse_teacher("minilm") == TeacherSpec("minilm", "minilm")
    assert parse_teacher("bert-base", "teacher").name == "bert-base"  # a known name is kept by every command
    assert parse_teacher("/data/ckpt/My Model/").name == "My-Model"  # a folder: its name, made a table name
    assert parse_teacher("/data/ckpt/My Model/", "teacher").name == "teacher"  # kd distill: the role
    assert parse_teacher("x=/data/b", "teacher") == TeacherSpec("x", "/data/b")  # the user's name wins
    assert str(TeacherSpec("teacher", "/data/b")) == "teacher=/data/b" and str(TeacherSpec("b", "/data/b")) == "/data/b"


@pytest.mark.parametrize("text", ["a/b=minilm", "..=minilm", "x y=minilm"])
def test_a_bad_name_is_refused_when_the_job_is_built(text, tmp_path):
    with pytest.raises(KdError) as e:
        PrecomputeJob([str(tmp_path / "in.txt")], str(tmp_path / "s"), [text])
    assert f"--teacher {text}" in str(e.value) and "NAME=minilm" in str(e.value)
    assert not (tmp_path / "s").exists()


def test_a_teacher_that_is_no_string_is_kd_s_error(tmp_path):
    with pytest.raises(KdError, match="a teacher must be a string, not 5"):
        PrecomputeJob([str(tmp_path / "in.txt")], str(tmp_path / "s"), [5])


def test_the_job_carries_the_parsed_values(tmp_path, tiny_teacher):
    spec, other = TeacherSpec("tiny", str(tiny_teacher)), shutil.copytree(tiny_teacher, tmp_path / "other")
    job = PrecomputeJob([str(tmp_path / "in.txt")], str(tmp_path / "s"), [spec, "minilm", Path(other)])
    assert job.specs == (spec, TeacherSpec("minilm", "minilm"), TeacherSpec("other", str(other)))
    assert job.teachers == (f"tiny={tiny_teacher}", "minilm", str(other))  # the record: what parses back


def test_resolving_keeps_the_spec_and_a_ref_is_resolved_once(tiny_teacher):
    ref = resolve_teacher(TeacherSpec("tiny", str(tiny_teacher)))
    assert (ref.name, ref.path, ref.source) == ("tiny", str(tiny_teacher), str(tiny_teacher))
    assert resolve_teacher(ref) is ref and ref.spec == TeacherSpec("tiny", str(tiny_teacher))


def test_distill_keeps_a_teacher_s_given_name(tmp_path, tiny_teacher):
    """`kd distill --teacher mine=FOLDER`: the store's table is `mine`, and the models check finds the folder
    (the spec rebuilt as "teacher=mine=FOLDER" was an unknown teacher before)."""
    other = shutil.copytree(tiny_teacher, tmp_path / "other")
    cfg = DistillConfig([str(tmp_path / "c.txt")], str(tmp_path / "run"), student="static",
                        teacher=f"mine={tiny_teacher},{other}", progress=False)
    run = _Run(cfg, cfg.plan())
    assert run.names == {"teacher": "mine", "teacher2": "teacher2"}
    assert run.specs["teacher2"] == TeacherSpec("teacher2", str(other))
    run.check_models()
    assert run.teacher("teacher") == TeacherRef("mine", str(tiny_teacher), str(tiny_teacher))


@pytest.mark.parametrize("given, says", [
    ("a={t},a={o}", "two teachers share a name (a={t}, a={o})"),  # distinct as text, one table
    ("{t},{t}/", "a teacher is given twice"),  # distill names folders by role: distinct names, one model
    ("mine={t},{t}", "a teacher is given twice"),
    ("a={t},b={link}", "a teacher is given twice"),  # the re-probe: one folder through a symlink
])
def test_teachers_that_are_not_distinct_are_refused_before_any_loads(tmp_path, tiny_teacher, monkeypatch, given,
                                                                    says):
    other = shutil.copytree(tiny_teacher, tmp_path / "other")
    (tmp_path / "link").symlink_to(tiny_teacher)
    text, says = given.format(t=tiny_teacher, o=other, link=tmp_path / "link"), says.format(t=tiny_teacher, o=other)
    monkeypatch.setattr(loading, "load", lambda *a, **k: pytest.fail("a teacher loaded"))
    cfg = DistillConfig([str(tmp_path / "c.txt")], str(tmp_path / "run"), student="static", teacher=text,
                        progress=False)
    with pytest.raises(KdError, match=re.escape(says)) as e:
        _Run(cfg, cfg.plan())
    assert e.value.where == "--teacher"
    if "share a name" in says:  # kd precompute names a folder by itself: "a" twice is a name twice there too
        with pytest.raises(KdError, match=re.escape(says)):
            PrecomputeJob([str(tmp_path / "in.txt")], str(tmp_path / "s"), text.split(","))
    with pytest.raises(KdError, match="share a name"):  # two folders of one name
        PrecomputeJob([str(tmp_path / "in.txt")], str(tmp_path / "s"), [str(tiny_teacher), str(tiny_teacher)])
    assert not (tmp_path / "s").exists() and not (tmp_path / "run").exists()


def test_a_start_model_that_is_not_found_is_named_as_the_start(tmp_path, tiny_teacher):
    """The seventh probe: kd distill --start junk said "--teacher junk: looked for the folder ..." and "fix: --teacher
    takes minilm, ..." (the user gave no --teacher)."""
    cfg = DistillConfig([str(tmp_path / "c.txt")], str(tmp_path / "run"), student="tiny3",
                        teacher=str(tiny_teacher), start=str(tmp_path / "junk"), progress=False)
    with pytest.raises(KdError) as e:
        _Run(cfg, cfg.plan()).check_models()
    where, fix = e.value.where, e.value.fix
    assert f"--start {tmp_path / 'junk'}: looked for the folder" in where and "--teacher" not in where, where
    assert fix.startswith("--start takes") and "--teacher" not in fix, fix


def test_a_found_teacher_is_not_looked_for_again(tmp_path, tiny_teacher, monkeypatch):
    """The run's check finds each model once; the precompute job and the load take that ref as it is."""
    ref = resolve_teacher(f"tiny={tiny_teacher}")
    monkeypatch.setattr(resolve, "_resolve_path", lambda source, *a: pytest.fail(f"{source} looked for again"))
    job = PrecomputeJob([str(tmp_path / "in.txt")], str(tmp_path / "s"), [ref])
    assert job.specs == (ref,) and job.teachers == (f"tiny={tiny_teacher}",)
    assert loading.load(job.specs[0], "torch", precision="fp32").ref is ref


def test_eval_names_a_teacher_by_the_same_rule(tiny_teacher):
    assert teacher_model(str(tiny_teacher)).name == tiny_teacher.name
    assert teacher_model(f"t={tiny_teacher}").name == "t"
    assert teacher_model(TeacherSpec("x", str(tiny_teacher))).name == "x"


def test_a_teacher_with_an_equals_sign_and_no_name_is_refused(tiny_teacher):
    """`--teacher =DIR` took the folder's own name (a name left out by mistake, read as none given: a probe)."""
    for text in (f"={tiny_teacher}", f" ={tiny_teacher}"):
        with pytest.raises(KdError, match="a teacher with '=' and no name before it") as e:
            parse_teacher(text)
        assert e.value.where == f"--teacher {text}" and f"NAME={tiny_teacher}" in e.value.fix
    assert parse_teacher(str(tiny_teacher)).name == tiny_teacher.name


def test_an_empty_teacher_or_a_name_with_a_blank_model_is_refused_as_such():
    """`-t ""` was "a teacher with a name and no model" (no name was given), `tt= ` an "unknown teacher ' '" (probe)."""
    for text in ("", "  "):
        with pytest.raises(KdError, match="--teacher is empty") as e:
            parse_teacher(text)
        assert e.value.where == "--teacher"
    for text in ("tt=", "tt= ", "tt=\t"):
        with pytest.raises(KdError, match="a teacher with a name and no model") as e:
            parse_teacher(text)
        assert "--teacher tt=minilm" in e.value.fix


def test_a_teacher_name_holds_no_dot():
    """'.' separates a teacher from its column (--target mpnet.sentence): a store of teacher "m.v2" trained into a
    KeyError traceback. A given name with one is refused; a folder's name loses it."""
    with pytest.raises(KdError, match="holds a '.'") as e:
        parse_teacher("m.v2=/data/b")
    assert "--teacher m-v2=/data/b" in str(e.value)
    assert parse_teacher("/models/all-MiniLM-L6-v2.1").name == "all-MiniLM-L6-v2-1"
    assert key_parts("m.v2.sentence") == ("m.v2", "sentence") == key_parts(column_key("m.v2", "sentence"))


# Who may take a reference in the teacher's rooms: its parse and search (resolve), its load on any backend (loading),
# and `kd finetune-teacher`, whose --base is its own command's edge.
REFERENCE_TAKERS = {"kd.pipeline.teacher.resolve", "kd.pipeline.backends.loading", "kd.pipeline.teacher.finetune"}


def reference_takers(tree: ast.AST) -> list[str]:
    """The functions of `tree` that take a TeacherSpec or TeacherRef argument or call resolve_teacher."""
    found = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        annotated = any(a.annotation is not None and re.search(r"\bTeacher(Spec|Ref)\b", ast.unparse(a.annotation))
                        for a in args)
        calls = any(isinstance(c, ast.Call) and ast.unparse(c.func).endswith("resolve_teacher") for c in ast.walk(fn))
        if annotated or calls:
            found.append(fn.name)
    return found


def test_past_its_parse_a_reference_is_loaded_in_one_module():
    """Issue 52: the teacher's own code (model.py: outputs, pooling, digests) and the graphs' (runtime, export,
    fidelity cache) take a folder or a loaded Teacher; a reference becomes one in pipeline/backends/loading.py alone
    (a `kd distill --teacher` trace touched the model and the runtime both, each resolving the text again)."""
    rooms = {n: f for n, f in modules().items() if n.startswith(("kd.pipeline.teacher.", "kd.pipeline.backends."))}
    assert set(REFERENCE_TAKERS) <= set(rooms) and len(rooms) > 10
    wrong = {n: takers for n, f in rooms.items() if n not in REFERENCE_TAKERS
             if (takers := reference_takers(ast.parse(f.read_text(encoding="utf-8"))))}
    assert not wrong, f"these take a teacher reference; load it with pipeline/backends/loading.py: {wrong}"


def test_the_reference_check_sees_an_argument_and_a_resolve():
    tree = ast.parse("def a(ref: TeacherRef, n: int): pass\ndef b(x: 'str | TeacherSpec'): pass\n"
                     "def c(p): return resolve.resolve_teacher(p)\ndef d(p: str, t: Teacher): pass\n")
    assert reference_takers(tree) == ["a", "b", "c"]
