"""Every file kd writes is guarded the same way (`common.outputs`): an existing output needs --overwrite,
--overwrite replaces only what kd wrote (never a user's file), a folder output has one writer at a time, a
killed export's leftovers never need --overwrite, and bad paths ('' , /proc/x) are what/where/fix errors.

The store: real news sentences through a tiny random BERT; a static student trained on it for two steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import precompute_news
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError
from kd.common.outputs import claim_output, is_kd_file, locked_output, sidecar, temp_path, write_text

MINE = "a user's notes, not kd's\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_teacher, sentences) -> dict[str, Path]:
    from kd.student.trainer import TrainConfig, train

    root = tmp_path_factory.mktemp("guard")
    store = precompute_news(root, tiny_teacher, sentences, 60, 30)
    student = train(TrainConfig(str(store), str(root / "students" / "st"), arch="static", target="tiny.mean",
                                embed_dim=8, max_steps=2, batch_size=16, progress=False))
    return {"store": store, "student": Path(student)}


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _query(store: Path, out: Path, *extra: str):
    return _cli("query", str(store), "SELECT 1 AS x", "--format", "csv", "--out", str(out), *extra)


def _leakage(store: Path, out: Path, *extra: str):
    return _cli("leakage", str(store), "--exclude-out", str(out), *extra)


def _guarded(run, out: Path) -> None:
    """The three rules for one file output `run(out, *extra)`."""
    out.write_text(MINE)
    res = run(out)
    assert res.exit_code == 2 and "already exists" in res.output and "--overwrite" in res.output, res.output
    res = run(out, "--overwrite")
    assert res.exit_code == 2 and "only replaces a file kd wrote" in res.output, res.output
    assert out.read_text() == MINE  # the user's file is never replaced
    out.unlink()
    res = run(out)
    assert res.exit_code == 0 and is_kd_file(out), res.output
    res = run(out, "--overwrite")
    assert res.exit_code == 0 and is_kd_file(out), res.output  # kd's own output is what --overwrite replaces
    out.write_bytes(out.read_bytes() + b"edited by hand\n")
    res = run(out, "--overwrite")
    assert res.exit_code == 2 and "changed" in res.output  # kd's file, edited since: the user's now


def test_query_out_is_guarded(built, tmp_path):
    _guarded(lambda out, *extra: _query(built["store"], out, *extra), tmp_path / "result.csv")


def test_leakage_exclude_out_is_guarded(built, tmp_path):
    _guarded(lambda out, *extra: _leakage(built["store"], out, *extra), tmp_path / "ids.txt")


def test_leakage_exclude_out_creates_missing_folders(built, tmp_path):
    out = tmp_path / "new" / "deeper" / "ids.txt"
    res = _leakage(built["store"], out)
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("# kd leakage") and is_kd_file(out)


def test_eval_files_are_guarded_before_the_work(built, tmp_path, monkeypatch):
    from kd.apps.eval import run as E

    def work(*a, **kw):
        raise RuntimeError("the evaluation started")

    monkeypatch.setattr(E, "_models", work)
    for flag, out in (("--json", tmp_path / "r.json"), ("--markdown", tmp_path / "r.md"),
                      ("--plot", tmp_path / "plots" / "sts_scatter.png")):
        out.parent.mkdir(exist_ok=True)
        out.write_text(MINE)
        where = str(out.parent if flag == "--plot" else out)
        res = _cli("eval", "--store", str(built["store"]), flag, where, "--no-progress")
        assert res.exit_code == 2 and "already exists" in res.output, res.output
        res = _cli("eval", "--store", str(built["store"]), flag, where, "--overwrite", "--no-progress")
        assert res.exit_code == 2 and "only replaces a file kd wrote" in res.output, res.output
        assert out.read_text() == MINE
        write_text(out, "{}", "kd eval")  # as a previous kd eval wrote it: --overwrite passes the gate
        res = _cli("eval", "--store", str(built["store"]), flag, where, "--overwrite", "--no-progress")
        assert isinstance(res.exception, RuntimeError), res.output


def test_eval_writes_its_files_through_the_gate(tmp_path):
    from kd.apps.eval.run import EvalConfig, EvalReport, write_outputs

    cfg = EvalConfig(json_path=str(tmp_path / "new" / "r.json"), markdown_path=str(tmp_path / "r.md"))
    write_outputs(EvalReport([], [], {}, {}), cfg)
    assert is_kd_file(cfg.json_path) and is_kd_file(cfg.markdown_path)
    assert not [p for p in tmp_path.rglob(".kd-tmp-*")]  # written whole, no temp file left


def test_embed_overwrite_never_replaces_a_users_file(built, tmp_path):
    src = tmp_path / "texts.txt"
    src.write_text("the market fell\nshares rose\n", encoding="utf-8")
    out = tmp_path / "v.parquet"

    def run(o: Path, *extra: str):
        return _cli("embed", str(src), "--student", str(built["student"]), "--out", str(o), "--no-progress", *extra)

    _guarded(run, out)


def test_an_empty_or_unwritable_path_is_a_clear_error(built, tmp_path, monkeypatch):
    from kd.apps.eval import run as E

    monkeypatch.setattr(E, "_models", lambda *a, **kw: pytest.fail("the evaluation started"))
    res = _cli("query", str(built["store"]), "SELECT 1", "--format", "csv", "--out", "")
    assert res.exit_code == 2 and "--out is empty" in res.output and "contains the input" not in res.output
    res = _cli("leakage", str(built["store"]), "--exclude-out", "")
    assert res.exit_code == 2 and "--exclude-out is empty" in res.output
    res = _cli("export", str(built["student"]), "--out", "")
    assert res.exit_code == 2 and "--out is empty" in res.output
    if Path("/proc/self").exists():
        res = _cli("query", str(built["store"]), "SELECT 1", "--format", "csv", "--out", "/proc/x.csv")
        assert res.exit_code == 2 and "cannot be written" in res.output and "fix:" in res.output, res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)
        for flag in ("--plot", "--json"):  # refused before the work, not after it
            res = _cli("eval", "--store", str(built["store"]), flag, "/proc/x", "--no-progress")
            assert res.exit_code == 2 and "cannot be written" in res.output, res.output


def test_a_file_without_its_sidecar_is_not_kds(tmp_path):
    """A kd file is recognised by its sidecar; without one (a copy, a file kd did not write) it is not."""
    out = tmp_path / "r.json"
    write_text(out, "{}", "kd eval")
    assert is_kd_file(out)
    sidecar(out).unlink()
    assert not is_kd_file(out)


# --- folders: one export at a time, a killed one's leftovers need no --overwrite ---------------------------
def _export(student: Path, out: Path, *extra: str):
    return _cli("export", str(student), "--out", str(out), *extra)


def test_a_second_export_into_the_same_folder_is_refused(built, tmp_path):
    pytest.importorskip("sentence_transformers")
    out = tmp_path / "exp"
    with locked_output(out, "kd export"):  # an export at work in this folder
        res = _export(built["student"], out)
        assert res.exit_code == 2 and "another kd export is writing --out" in res.output, res.output
    assert not out.exists()
    res = _export(built["student"], out)
    assert res.exit_code == 0, res.output
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no lock, no partial left


def test_a_lock_held_by_another_process_refuses_and_dies_with_it(built, tmp_path):
    pytest.importorskip("sentence_transformers")
    out = tmp_path / "exp"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom kd.common.outputs import locked_output\n"
         f"with locked_output({str(out)!r}, 'kd export'):\n    print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        res = _export(built["student"], out)
        assert res.exit_code == 2 and "another kd export" in res.output, res.output
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # as kill -9 of a running export: its lock goes with it
        holder.wait()
    res = _export(built["student"], out)
    assert res.exit_code == 0, res.output


def test_a_killed_exports_partial_folder_needs_no_overwrite(built, tmp_path):
    pytest.importorskip("sentence_transformers")
    out = tmp_path / "exp"
    for name in (".exp.kd-partial-999999", ".exp.kd-partial-old-999999"):  # what a kill -9 leaves behind
        (tmp_path / name / "model").mkdir(parents=True)
        (tmp_path / name / "model" / "half.bin").write_bytes(b"half")
    (tmp_path / ".exp.kd-lock").write_text("")  # its lock file (the lock itself died with it)
    res = _export(built["student"], out)
    assert res.exit_code == 0, res.output
    assert (out / "modules.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]


def test_a_finetune_folder_has_one_writer(tmp_path):
    from kd.common.errors import InputError
    from kd.common.outputs import FINETUNE
    from kd.common.tasks import fresh_output

    out = tmp_path / "ft"
    with fresh_output(str(out), False, FINETUNE, []):
        with pytest.raises(InputError, match="another kd finetune is writing"), \
                fresh_output(str(out), False, FINETUNE, []):
            pass
        assert out.is_dir()  # the refused run never removed the running one's folder


def test_eval_refuses_two_outputs_on_one_path(tmp_path):
    """--json and --markdown on one file: the second write would silently replace the first report."""
    from kd.apps.eval.run import EvalConfig, check_outputs

    same = str(tmp_path / "r.json")
    with pytest.raises(InputError, match="--markdown and --json name the same file"):
        check_outputs(EvalConfig(teacher="x", json_path=same, markdown_path=same))
    assert not (tmp_path / "r.json").exists()
    # the same file spelled another way (a '..' and a file: URI) is the same file
    for other in (str(tmp_path / "sub" / ".." / "r.json"), (tmp_path / "r.json").as_uri()):
        (tmp_path / "sub").mkdir(exist_ok=True)
        with pytest.raises(InputError, match="--markdown and --json name the same file"):
            check_outputs(EvalConfig(teacher="x", json_path=same, markdown_path=other))
    # two links naming one (missing) file are two outputs: each link is replaced by its own file, never written
    # through (it was refused as "the same file": a probe); one link and the path it names are two files too
    (tmp_path / "j1").symlink_to(tmp_path / "missing.md")
    (tmp_path / "j2").symlink_to(tmp_path / "missing.md")
    check_outputs(EvalConfig(teacher="x", json_path=str(tmp_path / "j1"), markdown_path=str(tmp_path / "j2")))
    check_outputs(EvalConfig(teacher="x", json_path=str(tmp_path / "j1"), markdown_path=str(tmp_path / "missing.md")))
    with pytest.raises(InputError, match="--markdown and --json name the same file"):
        check_outputs(EvalConfig(teacher="x", json_path=str(tmp_path / "j1"), markdown_path=str(tmp_path / "j1")))
    assert not (tmp_path / "missing.md").exists() and (tmp_path / "j1").is_symlink()


def test_an_output_and_its_record_never_share_a_place(tmp_path):
    """Each file kd writes has its record beside it (.NAME.kd.json). An output named as a record was written over
    another output's record, or had its own record replaced (kd eval, exit 0: the report said written was gone); --plot
    a folder where --json's record goes ended in a traceback after the evaluation; a user's file where a record goes
    was replaced without --overwrite, and a folder there failed the command after its work (a probe)."""
    from kd.apps.eval.run import EvalConfig, check_outputs

    report = tmp_path / "r.json"
    for json_path, md in ((report, tmp_path / ".r.json.kd.json"), (tmp_path / ".r.md.kd.json", tmp_path / "r.md")):
        with pytest.raises(InputError, match="named as kd's record of another file"):
            check_outputs(EvalConfig(teacher="x", json_path=str(json_path), markdown_path=str(md)))
    # named as a temp file of a killed write: kd's next write of that name deleted it (a probe)
    with pytest.raises(InputError, match=r"named as one of kd's temporary files \(.kd-tmp-...\)"):
        check_outputs(EvalConfig(teacher="x", json_path=str(tmp_path / ".kd-tmp-99999.r.json")))
    with pytest.raises(InputError, match=r"--json's record \(.r.json.kd.json\) and --plot name the same file"):
        check_outputs(EvalConfig(teacher="x", json_path=str(report), plot_dir=str(tmp_path / ".r.json.kd.json")))
    assert sorted(tmp_path.iterdir()) == []
    mine = sidecar(report)
    mine.write_text(MINE)  # a user's file (any name: kd's records are hidden files of a known form)
    with pytest.raises(InputError, match="holds a file kd did not write") as e:
        claim_output(report, "kd eval", file=True, flag="--json", overwrite=True)
    assert e.value.where == str(mine) and mine.read_text() == MINE
    mine.unlink()
    mine.mkdir()
    with pytest.raises(InputError, match="which is a folder") as e:
        claim_output(report, "kd eval", file=True, flag="--json")
    assert e.value.where == str(mine)
    mine.rmdir()
    mine.symlink_to(tmp_path / "nowhere")  # a user's link, even to nothing, is not replaced (it was, exit 0: a probe)
    with pytest.raises(InputError, match="which is a symbolic link") as e:
        claim_output(report, "kd eval", file=True, flag="--json")
    assert e.value.fix == f"remove the link {mine}" and mine.is_symlink()
    mine.unlink()
    write_text(report, "{}", "kd eval", "--json")  # kd's own record (its file deleted or not) is no obstacle
    report.unlink()
    claim_output(report, "kd eval", file=True, flag="--json")
    write_text(report, "{}", "kd eval", "--json")
    claim_output(report, "kd eval", file=True, flag="--json", overwrite=True)


def test_a_trailing_slash_and_a_folder_named_as_a_temp_are_no_file_output(tmp_path):
    """`--json r.json/` wrote a file r.json; a user's folder named like a killed write's temp beside an output
    failed the write as "--json cannot be written: Is a directory" (kd's sweep of its temps tried to delete it; a
    probe): refused as a folder's path, and left alone while the output is written."""
    with pytest.raises(InputError, match="ends in '/', a folder's path, where kd eval writes one file"):
        claim_output(f"{tmp_path / 'r.json'}/", "kd eval", file=True, flag="--json")
    assert list(tmp_path.iterdir()) == []
    mine = tmp_path / ".kd-tmp-999999.r.json"
    mine.mkdir()
    (mine / "notes.txt").write_text(MINE)
    write_text(tmp_path / "r.json", "{}", "kd eval", "--json")
    assert is_kd_file(tmp_path / "r.json") and (mine / "notes.txt").read_text() == MINE


def test_a_file_kd_did_not_write_is_refused_with_the_right_fix(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("my notes")
    with pytest.raises(InputError, match="kd did not write this file, so --overwrite will not replace it"):
        claim_output(mine, "kd query", file=True, flag="--out")


def test_export_overwrite_keeps_a_users_file_in_the_folder(built, tmp_path):
    """--overwrite replaces an export, never notes a user put in it: refused, the old folder as it was."""
    pytest.importorskip("sentence_transformers")
    out = tmp_path / "exp"
    assert _export(built["student"], out).exit_code == 0
    (out / "notes.txt").write_text(MINE)
    before = sorted(p.name for p in out.iterdir())
    res = _export(built["student"], out, "--overwrite")
    assert res.exit_code == 2 and "kd export did not write" in res.output and "notes.txt" in res.output, res.output
    assert (out / "notes.txt").read_text() == MINE and sorted(p.name for p in out.iterdir()) == before
    (out / "notes.txt").unlink()
    # another kd command's output (vectors kd embed wrote there), or a file named like kd's record of one the export
    # writes: each counted as the export's, and deleted (a probe)
    for name, write in (("vecs.txt", lambda: write_text(out / "vecs.txt", MINE, "kd embed")),
                        (".modules.json.kd.json", lambda: (out / ".modules.json.kd.json").write_text(MINE))):
        write()
        res = _export(built["student"], out, "--overwrite")
        said = " ".join(res.output.split())
        assert res.exit_code == 2 and f"kd export did not write, e.g. {name}" in said, said
        assert (out / name).read_text() == MINE
        (out / name).unlink()
        sidecar(out / name).unlink(missing_ok=True)
    assert _export(built["student"], out, "--overwrite").exit_code == 0


def test_a_link_where_kd_writes_a_file_is_replaced_never_written_through(tmp_path):
    """kd distill's report.md or card made a link while the run went on: the report and the card were written onto the
    user's file the link named, outside --out, with a sidecar beside it (a probe). The link itself is replaced."""
    theirs = tmp_path / "elsewhere" / "theirs.md"
    theirs.parent.mkdir()
    theirs.write_text(MINE)
    for name, target in (("report.md", theirs), ("dangling.md", tmp_path / "elsewhere" / "new.md")):
        link = tmp_path / "out" / name
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(target)
        assert temp_path(link).parent == link.parent  # (not even a temp file beside what it names)
        assert write_text(link, "table", "kd distill") == link
        assert not link.is_symlink() and link.read_text() == "table" and is_kd_file(link)
    assert theirs.read_text() == MINE and sorted(p.name for p in theirs.parent.iterdir()) == ["theirs.md"]


def test_an_export_is_readable_by_others_as_a_plain_file_is(built, tmp_path):
    """safetensors wrote model.safetensors 0600: an export copied to a shared folder could not be served by
    another user. Every exported file now has the mode open() gives under the umask."""
    pytest.importorskip("sentence_transformers")
    old = os.umask(0o022)
    try:
        res = _export(built["student"], tmp_path / "exp")
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in (tmp_path / "exp").rglob("*")
             if p.is_file()}
    assert "exp/model.safetensors" in modes and set(modes.values()) == {"0o644"}, modes


@pytest.mark.parametrize("form", ["file://{}", "file:{}", "file://localhost{}", "uri"])
def test_a_file_uri_names_the_local_file(tmp_path, monkeypatch, form):
    """`kd eval --json file:///abs/x.json` wrote ./file:/abs/x.json, and file:/abs, file://localhost/abs and %20 (as
    Path.as_uri() writes a space) were misread too (probes): every gate reads a file: URI as the path it names."""
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "out put" / "x.json"
    uri = target.as_uri() if form == "uri" else form.format(target)
    claimed = claim_output(uri, "kd eval", file=True)
    written = write_text(uri, "{}\n", "kd eval")
    assert claimed == written == target and target.read_text() == "{}\n" and is_kd_file(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out put"]


def test_leakage_names_the_file_it_wrote_as_exclude_ids_reads_it(built, tmp_path):
    """--exclude-out file:///abs/ids.txt printed "--exclude-ids file:///abs/ids.txt", and a path with a space
    unquoted, which broke the line a user pastes. train-student reads file: URIs as the files they name (they were
    "not found") and records the files, not the spellings."""
    out = tmp_path / "the ids.txt"
    res = _leakage(built["store"], f"file://{out}")  # type: ignore[arg-type]
    assert res.exit_code == 0 and f"--exclude-ids '{out}'" in " ".join(res.output.split()), res.output
    student = tmp_path / "st"
    res = _cli("train-student", "--shards", f"file://localhost{built['store']}", "--exclude-ids", out.as_uri(),
               "--out", student.as_uri(), "--arch", "static", "--target", "tiny.mean", "--embed-dim", "8",
               "--max-steps", "1", "--no-progress")
    assert res.exit_code == 0, res.output
    args = json.loads((student / "training_args.json").read_text())
    assert (args["store"], args["exclude_ids"]) == (str(built["store"].resolve()), str(out)), args


def test_a_remote_address_is_refused_where_kd_writes_locally(tmp_path, monkeypatch, built):
    """s3://bucket/x as an output was written to ./s3:/bucket/x with exit 0 (a probe)."""
    store_path = built["store"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="remote address"):
        claim_output("s3://bucket/x.json", "kd eval", file=True)
    for args in (["train-student", "--shards", str(store_path), "--out", "s3://bucket/x", "--max-steps", "1"],
                 ["query", str(store_path), "select 1 as n", "-f", "csv", "-o", "s3://bucket/q.csv"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "remote address" in res.output, res.output
    assert list(tmp_path.iterdir()) == []
