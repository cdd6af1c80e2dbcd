"""Shared fixtures: tiny random BERT teachers built in-process (fast) and paths to the real data."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

# `kd precompute --precision auto` is bf16 on CPUs with native bf16: the suite pins fp32 so its exact checks
# hold on every machine (subprocesses inherit this); tests of the bf16 default set KD_CPU_BF16=1 themselves.
os.environ.setdefault("KD_CPU_BF16", "0")


def _suite_cache() -> None:
    """`--backend auto` (the default) exports teachers into KD_CACHE: the suite exports into a folder of its own,
    never ~/.cache/kd; the unpacked mpnet there is linked in (unpacking it again takes a minute). The folder goes
    when the session's process exits: left behind, every run kept ~140 MB of exports in /tmp, and a machine's
    disk filled up with them (a CI run then failed its set-up with ENOSPC)."""
    if "KD_CACHE" in os.environ:
        return
    import atexit
    import shutil
    import tempfile

    cache = Path(tempfile.mkdtemp(prefix="kd-test-cache-"))
    atexit.register(shutil.rmtree, cache, ignore_errors=True)  # rmtree unlinks the mpnet link, never its target
    mpnet = Path.home() / ".cache" / "kd" / "teachers" / "all-mpnet-base-v2"
    if mpnet.is_dir():
        (cache / "teachers").mkdir()
        (cache / "teachers" / mpnet.name).symlink_to(mpnet, target_is_directory=True)
    os.environ["KD_CACHE"] = str(cache)


_suite_cache()

# A test that runs long (a whole distill, a subprocess killed and resumed) printed nothing under `pytest -q` for
# minutes (issue 49: no silence over ~10 s). A helper process for the session (tests/heartbeat.py) says which test (or
# the collection, or the session's end) is still running whenever nothing was written for HEARTBEAT_S seconds.
# Silence is measured from the last output, not from each test's start: a beat timed per test left 10.2 s between one
# test's dot and the next test's first beat; pytest writes a dot without flushing, so into a pipe (CI, a log) it
# waited there; and a thread of the session, which needs the GIL, missed beats while a call held it (17.7 s).
HEARTBEAT_S = 6.0  # 4 s of slack under 10: a beat landed 4 s late while a Ray cluster test loaded both cores


class _Heartbeat:
    def __init__(self, fd: int, writer: object) -> None:
        self.writer = writer
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("heartbeat.py")), str(HEARTBEAT_S)],
                                     stdin=subprocess.PIPE, stdout=fd)

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError):  # the helper gone: the session goes on without beats
            self.proc.stdin.write(f"{line}\n".encode())
            self.proc.stdin.flush()

    def running(self, what: str) -> None:
        self._say(f"run {what}")

    def wrote(self) -> None:
        self._say("wrote")


_BEAT: list[_Heartbeat] = []  # the session's, once started


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    fd = _terminal_fd(session.config)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")  # none in an xdist worker, say
    if fd is not None and reporter is not None:
        _BEAT.append(_Heartbeat(fd, session.config.get_terminal_writer()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if _BEAT:
        _BEAT[0].running(item.nodeid)
    yield


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _BEAT:  # after the terminal reporter wrote the test's dot
        _BEAT[0].writer.flush()
        _BEAT[0].wrote()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The helper beats on through the summary and the interpreter's exit (14 s in one walk); it leaves when this
    process has gone."""
    if _BEAT:
        _BEAT[0].running("the end of the session")


def _terminal_fd(config: pytest.Config) -> int | None:
    """The terminal's stdout while a test runs: under pytest's default fd capture, fd 1 is a capture file then,
    and the capture keeps a duplicate of the real one; written to directly, a heartbeat never suspends the capture
    (another thread's suspend could take a running test's captured output). Without fd capture (-s, --capture=sys)
    fd 1 is the terminal. (`targetfd_save` is pytest's own name for that duplicate; None where it has none.)"""
    capman = config.pluginmanager.get_plugin("capturemanager")
    out = getattr(getattr(capman, "_global_capturing", None), "out", None)
    if out is None:
        return 1
    return getattr(out, "targetfd_save", None)

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KD_SHARED", ROOT.parent / "shared"))
DATA = SHARED / "data"


def shared_file(*parts: str) -> Path:
    """A file under ../shared/data (or $KD_SHARED/data). A user's clone has no ../shared, so a test that needs
    one skips with the reason there; CI (CI=true) always has it, so there a missing file fails the test instead
    of silently skipping it."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        reason = f"needs {path} (the shared data, absent here; set KD_SHARED to the folder holding data/)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path

WORDS = (
    "the a an of to and in is was for on that with as by at it from this be are were have has not "
    "cat dog bird fish man woman child house car tree river city country music film game news world "
    "good bad big small new old red blue green fast slow happy sad runs eats sees likes plays reads "
    "market stock price rose fell said year day week people government police report study water"
).split()


def build_tiny_bert(path: Path, *, num_labels: int = 0, hidden: int = 32, layers: int = 2, seed: int = 0,
                    extra_words: tuple[str, ...] = ()) -> Path:
    """Save a random BERT (optionally with a classification head) plus a WordPiece tokenizer to `path`
    (`extra_words` makes another vocabulary: a teacher whose token ids differ)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *[f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"],
             *"abcdefghijklmnopqrstuvwxyz.,!?'", *extra_words]
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(dict.fromkeys(vocab))}, do_lower_case=True)
    tok.model_max_length = 64
    tok.save_pretrained(path)
    cfg = BertConfig(
        vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=hidden * 2, max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    if num_labels:
        cfg.num_labels = num_labels
        cfg.id2label = {i: f"label_{i}" for i in range(num_labels)}
        cfg.label2id = {v: k for k, v in cfg.id2label.items()}
        model = BertForSequenceClassification(cfg)
    else:
        model = BertModel(cfg)
    model.eval()
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory) -> Path:
    """A random 2-layer, 32-d BERT encoder saved as a Hugging Face checkpoint directory."""
    return build_tiny_bert(tmp_path_factory.mktemp("teachers") / "tiny-bert")


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory) -> Path:
    """A random BERT with a 3-way sequence-classification head (a stand-in cross-encoder)."""
    return build_tiny_bert(tmp_path_factory.mktemp("teachers") / "tiny-ce", num_labels=3, seed=1)


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    """300 real sentences of the Leipzig news corpus, from the sample the package ships for `kd demo`: the same
    text on a user's clone (no ../shared) as in CI."""
    from kd.apps.eval.corpus import demo_corpus

    return [text for source, text in demo_corpus() if source == "leipzig-news"][:300]


def precompute_news(root: Path, teacher: Path, sentences: list[str], rows: int, shard_rows: int) -> Path:
    """A real store: the first `rows` news sentences through `teacher` (named "tiny"), at root/store."""
    from kd.pipeline.precompute import precompute

    src = root / "news.txt"
    src.write_text("\n".join(sentences[:rows]) + "\n", encoding="utf-8")
    precompute([str(src)], str(root / "store"), [f"tiny={teacher}"], shard_rows=shard_rows, progress=False)
    return root / "store"
