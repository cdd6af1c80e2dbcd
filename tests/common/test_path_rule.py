"""common.paths: the one rule for the file a path names (file: URIs, remote addresses, NUL), and the readers and
the store layer that follow it (a probe: `kd precompute -o file:/abs` wrote ./file:/abs, `file://localhost/abs`
wrote ./localhost/abs, and inputs given as file: URIs were "not found")."""

import pyarrow.parquet as pq
import pytest
import training_runs
from typer.testing import CliRunner

from kd.cli import app
from kd.common.errors import InputError
from kd.common.inputs import expand_inputs
from kd.common.paths import is_uri, local_path, plain_path
from kd.storage import fs


@pytest.mark.parametrize("form", ["file://{}", "file:{}", "file://localhost{}", "FILE://{}", "file://LocalHost{}",
                                  "uri"])
def test_a_file_uri_is_the_path_it_names(tmp_path, form):
    target = tmp_path / "a b#1" / "x.txt"
    uri = target.as_uri() if form == "uri" else form.format(str(target).replace("#", "%23").replace(" ", "%20"))
    assert not is_uri(uri) and plain_path(uri) == str(target) and local_path(uri) == target
    assert fs.resolve(uri).root == str(target)  # the store layer reads it as the same folder


def test_paths_and_remote_addresses_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for remote in ("s3://bucket/x", "gs://b/q.csv", "hdfs://host:9000/x"):
        assert is_uri(remote) and plain_path(remote) == remote
        with pytest.raises(InputError, match="remote address"):
            local_path(remote)
    for local in ("./a://b", "a:b", "C:\\x.csv", "notes.csv", "sub/dir/"):  # paths, however odd
        assert not is_uri(local) and plain_path(local) == local
        assert local_path(local) == (tmp_path / local.rstrip("/")).resolve()


@pytest.mark.parametrize("bad, why", [
    ("file://otherhost/tmp/x", "another machine"), ("file:", "naming no path"), ("file://localhost", "naming no path"),
    ("file:///tmp/run#1.csv", "query or fragment"), ("file:///tmp/x?v=2", "query or fragment"),
    ("file:///tmp/x%00.csv", "NUL"), ("/tmp/a\0b", "NUL"),
])
def test_what_names_no_local_file_is_refused(bad, why):
    with pytest.raises(InputError, match=why):
        plain_path(bad)


def test_a_corpus_given_as_a_file_uri_is_read(tmp_path):
    corpus = tmp_path / "my corpus.txt"
    corpus.write_text("one sentence.\n")
    assert expand_inputs([corpus.as_uri()]) == [str(corpus)]


def test_a_relative_path_in_an_old_record_is_read_from_the_folder_the_run_started_in(tmp_path, monkeypatch):
    """kd before 2026-11-30 recorded paths as typed: read against the current folder, `--shards store` typed in
    another folder matched another store (a probe: the dead run's metrics were deleted). The folder the run
    started in is its out less the parts of the recorded out; where that cannot be told, `unknown` decides."""
    from kd.common.paths import recorded_files

    out, rec = tmp_path / "w" / "runs" / "a", tmp_path / "w" / "runs" / "a" / ".kd-started.json"
    monkeypatch.chdir(tmp_path)
    told = recorded_files({"out": "runs/a", "store": "store", "init": None}, ["out", "store", "init"], out, rec)
    assert told == {"out": str(out), "store": str(tmp_path / "w" / "store"), "init": None}
    climbing = {"out": "../runs/a", "store": "store"}
    assert recorded_files(climbing, ["store"], out, rec)["store"] == str(tmp_path / "store")  # "here": as before
    assert "does not name" in recorded_files(climbing, ["store"], out, rec, guess_here=False)["store"]
    moved = {"out": "deep/er/runs/b", "store": "store"}  # not the end of out (more parts than it has, too)
    assert "does not name" in recorded_files(moved, ["store"], out, rec, guess_here=False)["store"]
    deeper = {"out": "a/" * 30, "store": "s"}
    assert "does not name" in recorded_files(deeper, ["store"], out, rec, guess_here=False)["store"]
    absolute = {"out": "../x", "store": str(tmp_path / "data" / "store"), "exclude_ids": ["s3://b/ids"]}
    assert recorded_files(absolute, ["store", "exclude_ids"], out, rec, guess_here=False) == absolute
    # (a probe) `--out .` was started in out itself; an out reached through a link is matched as given first (its
    # links followed, `runs/a` named a folder the user never used); a recorded value that names no local file is
    # the record's fault, not the user's input
    assert recorded_files({"out": ".", "store": "s"}, ["store"], out, rec, guess_here=False)["store"] == str(out / "s")
    (tmp_path / "scratch" / "runs" / "a").mkdir(parents=True)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "runs").symlink_to(tmp_path / "scratch" / "runs")
    linked = recorded_files({"out": "runs/a", "store": "s"}, ["store"], tmp_path / "ws" / "runs" / "a", rec,
                            guess_here=False)
    assert linked["store"] == str(tmp_path / "ws" / "s")
    for bad in ("file://otherhost/x", "a\0b", "file:"):
        for record in ({"out": "runs/a", "store": bad}, {"out": bad, "store": "s"}):  # (out: where the run began)
            with pytest.raises(InputError, match="records a path kd cannot read") as e:
                recorded_files(record, ["out", "store"], out, rec)
            assert e.value.where == str(rec) and "--overwrite" in e.value.fix


store_path, trained = training_runs.store_path, training_runs.trained


def test_every_file_kd_reads_by_itself_may_be_a_file_uri(trained, tiny_teacher, tmp_path):
    """`kd export|embed|search|eval --student file:///...`, a text file and a teacher folder given as file: URIs
    were "not found" (only the corpus, the store and the outputs followed the rule): every option declared a `path`
    now reads one as the path it names, a teacher folder where it is parsed."""
    texts = tmp_path / "a b" / "t.txt"
    texts.parent.mkdir()
    texts.write_text("the cat runs fast.\nthe market rose.\n", encoding="utf-8")
    student = trained.as_uri()

    def kd(*args: str) -> str:
        res = CliRunner().invoke(app, list(args))
        assert res.exit_code == 0, (args, res.output)
        return " ".join(res.output.split())

    kd("export", student, "-o", str(tmp_path / "export"))
    assert (tmp_path / "export" / "modules.json").is_file()
    kd("embed", texts.as_uri(), "--student", student, "-o", str(tmp_path / "e.parquet"))
    assert pq.read_table(tmp_path / "e.parquet").num_rows == 2
    assert "│ student │" in kd("eval", "--student", student, "--task", "sts", "--no-baseline", "--no-progress",
                              "--no-cache")
    said = kd("precompute", texts.as_uri(), "-o", str(tmp_path / "st"), "--teacher", f"tiny={tiny_teacher.as_uri()}",
              "--no-progress")
    assert "2 rows encoded of 2" in said, said


def test_a_remote_address_where_kd_reads_a_local_file_is_refused_naming_the_option(store_path, tmp_path):
    """`--init s3://b/s` said "no trained student here", `kd eval --student gs://...` "not found": an option declared
    `path` names a local file or folder, so a remote address there is refused as one, naming the option."""
    for args, option in ((["train-student", "-s", str(store_path), "-o", str(tmp_path / "o"), "--init", "s3://b/s"],
                          "--init"),
                         (["eval", "--student", "gs://b/student", "--task", "sts"], "--student"),
                         (["export", "hdfs://h:9000/s", "-o", str(tmp_path / "e")], "STUDENT")):
        res = CliRunner().invoke(app, args)
        said = " ".join(res.output.split())
        assert res.exit_code == 2 and "a remote address, where kd reads a local file or folder" in said, said
        assert f"where: {option}" in said and "copy it to this machine" in said, said
    assert not (tmp_path / "o").exists() and not (tmp_path / "e").exists()


@pytest.mark.parametrize("args", [["info", ""], ["validate", " "], ["index", ""], ["leakage", ""], ["query", "", "x"],
                                  ["precompute", "in.txt", "-o", "O", "--reuse", ""],
                                  ["precompute", "-o", "O", "--add-to", " "],
                                  ["eval", "--teacher", "minilm", "--store", "", "--task", "sts"],
                                  ["train-student", "--shards", "", "-o", "O"]])
def test_an_empty_store_is_refused_naming_it(args, tmp_path, monkeypatch):
    """A store given as "" was the working folder (`kd index ""` inside a store indexed it) or ignored
    (`kd precompute --reuse ""`, `kd eval --store ""`); a blank one gave unrelated messages (probes)."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, args)
    shown = next((a for a in args if a.startswith("-") and args[args.index(a) + 1].strip() == ""), "STORE")
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and f"error: {shown} is empty" in said and f"pass a path for {shown}" in said, said
    assert list(tmp_path.iterdir()) == []


def test_a_store_may_be_a_remote_address():
    """A store option takes a remote address to its reader (pyarrow's filesystems), unlike a local path option."""
    res = CliRunner().invoke(app, ["info", "memory://b/x"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "no store can be opened at this address" in said and "where: memory://b/x" in said


def test_a_path_where_a_string_option_is_declared_is_its_text():
    """`kd.distill(teacher=Path(...))` failed on `.split()`, `objectives=(Path("cosine"),)` on a tuple of Paths: a
    config holds each declared str option (alone, in a list or a tuple) as text, whatever the Python caller passed."""
    from pathlib import Path

    from kd.apps.distill.config import DistillConfig
    from kd.student.train_config import TrainConfig

    cfg = TrainConfig(Path("s"), Path("o"), objectives=(Path("cosine"),), init=Path("file:/tmp/x"))
    assert (cfg.store, cfg.out, cfg.objectives, cfg.init) == ("s", "o", ("cosine",), "/tmp/x")
    run = DistillConfig([Path("c.txt")], Path("o"), teacher=Path("t"), recipe=Path("file:///tmp/r.toml"))
    assert (run.inputs, run.teacher, run.recipe) == (["c.txt"], "t", "/tmp/r.toml")
