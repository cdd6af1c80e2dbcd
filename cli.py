"""`kd` command line: thin. Each command parses options, calls one library function, prints.

All logic lives in `pipeline`, `student`, `storage` and `apps`, importable and tested without the CLI.
Heavy imports (torch, transformers) happen inside commands so `kd --help` stays fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
import secrets
import shlex
import signal
import sys
import types
import typing
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional  # noqa: F401  (Optional: typer needs it on py3.10 annotations)

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from kd.apps.demo.config import DemoConfig  # (light, as the two below)
from kd.apps.distill.config import DistillConfig
from kd.apps.eval.config import EvalConfig
from kd.apps.leakage_config import LeakageConfig
from kd.apps.query_config import QueryConfig
from kd.apps.search_config import SearchConfig
from kd.common import bounds as B
from kd.common import options
from kd.common.errors import InputError, KdError, as_kd_error
from kd.common.options import Option
from kd.common.paths import local_path
from kd.common.stop import Stopped, sigterm_interrupts
from kd.dataset.cluster_config import ClusterConfig
from kd.dataset.index_config import IndexConfig
from kd.pipeline.job import PrecomputeJob  # (light: the CLI's parameters are built from its fields)
from kd.pipeline.teacher.finetune_config import TeacherFinetuneConfig
from kd.storage.info_config import InfoConfig
from kd.storage.validate_config import ValidateConfig
from kd.student.embed_config import EmbedConfig
from kd.student.exporters import ExportConfig
from kd.student.finetune_config import FinetuneConfig
from kd.student.train_config import TrainConfig  # (the same)


def _debug(ctx: Any = None) -> bool:
    """--debug on the command line (kept in the context) or KD_DEBUG=1: show tracebacks, translate nothing."""
    return bool(getattr(ctx, "obj", None) and ctx.obj.get("debug")) or os.environ.get("KD_DEBUG", "") not in ("", "0")


class _Commands(TyperGroup):
    """Runs every command, so one place decides what a user sees when an exception escapes one.

    A user-caused one (full disk, no permission, a wrong path, invalid JSON, a binary file, input nested too
    deeply: `as_kd_error`) is printed as what/where/fix and exits 2, never as a traceback; anything else is a
    bug and keeps its traceback, as does everything under --debug.

    Ctrl-C or SIGTERM (raised as a KeyboardInterrupt, `sigterm_interrupts`) is never a bare "Aborted!" or a
    silent death: it exits 130 / 143 saying what the command kept and the exact line that resumes it
    (`apps.interrupted`); a command that stops on its own (`Stopped`: training, Ray) gets that line too.
    """

    def invoke(self, ctx: Any) -> Any:
        argv = [*getattr(ctx, "_protected_args", ()), *ctx.args]  # the command line after `kd` (click empties it)
        try:
            with sigterm_interrupts():
                return super().invoke(ctx)
        except KeyboardInterrupt as e:
            if _debug(ctx):
                raise
            from kd.apps.interrupted import interrupted

            name = ctx.invoked_subcommand or (argv[0] if argv else "")
            _fail(interrupted(name, self._params(ctx, argv), getattr(e, "signum", signal.SIGINT), argv))
        except Exception as e:
            err = as_kd_error(e)
            if err is None or _debug(ctx):
                raise
            if err.where is None:  # e.g. a write to an open file fails: the OSError names no file
                err = err.at(f"while running kd {ctx.invoked_subcommand}")
            if isinstance(err, Stopped) and err.resume is None:
                from kd.apps.interrupted import resume_command

                err = err.resuming(resume_command(ctx.invoked_subcommand or "", argv))
            _fail(err)

    def _params(self, ctx: Any, argv: list[str]) -> dict[str, Any]:
        """The stopped command's options as parsed (its paths name what was kept); {} if they cannot be read."""
        try:
            cmd = self.get_command(ctx, argv[0])
            return cmd.make_context(argv[0], argv[1:], parent=ctx, resilient_parsing=True).params
        except Exception:  # only a message's detail depends on it
            return {}


app = typer.Typer(cls=_Commands, no_args_is_help=True, add_completion=False,
                  help="Offline knowledge distillation of sentence encoders.")
# No markup in what kd prints: paths, texts and SQL results hold brackets ("x[/]y" was rich's MarkupError traceback
# after the work was done: the sixth probe's re-run); kd's own styles are Text spans (`_tagged`).
console = Console(stderr=True, soft_wrap=True, markup=False)
term = Console(soft_wrap=True, markup=False)  # results go to stdout; errors and progress to stderr


def _in(r: B.Range) -> dict[str, Any]:
    """typer.Option keywords bounding a number to `r`: typer's min/max, plus a callback refusing an open end.

    Either way a bad value exits 2 at parse time with "Invalid value for '--flag'", before anything runs.
    """
    opts: dict[str, Any] = {"min": r.lo, "max": r.hi}
    if r.lo_open or r.hi_open:
        def edge(value: float | None) -> float | None:
            if value is not None and value not in r:
                raise typer.BadParameter(f"{value:g} is not in {r}")
            return value

        opts["callback"] = edge
    return opts


def _device(auto: bool) -> dict[str, Any]:
    """typer.Option keywords for --device: cpu, cuda, cuda:N (and auto where the command has it)."""
    forms = B.DEVICES if auto else B.DEVICES[1:]

    def check(value: str | None) -> str | None:
        if value is not None and (not B.DEVICE.fullmatch(value) or (value == "auto" and not auto)):
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(forms)}")
        return value

    return {"callback": check}


def _tagged(tag: str, style: str, rest: object) -> Text:
    """`tag` in `style`, then `rest` as it is (a fix may read pip install 'kd[onnx]', a path x[/]y)."""
    return Text.assemble((tag, style), f" {rest}")


def _fail(e: KdError) -> None:
    console.print(_tagged("error:", "bold red", e))
    raise typer.Exit(e.exit_code)


def _cli_default(f: dataclasses.Field) -> Any:
    """A field's default as typer shows and parses it (a list for a sequence; None for an empty one)."""
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    elif f.default is dataclasses.MISSING:
        return inspect.Parameter.empty  # required
    else:
        value = f.default
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return list(value) or None
    return value


def _cli_type(hint: Any, opt: Option) -> Any:
    """The value type typer parses: the choices' Literal, str for a comma list, list[X] for a sequence."""
    if opt.choices is not None:  # a repeatable option of choices takes a str Enum (typer: no list of Literals)
        return list[opt.choices] if typing.get_origin(hint) in (tuple, list) else opt.choices
    if opt.comma:
        return str
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return _cli_type(args[0], opt)
    return list[args[0]] if typing.get_origin(hint) in (tuple, list) else hint


def _parameter(f: dataclasses.Field, opt: Option, hint: Any) -> inspect.Parameter:
    """One typer parameter of a config field: its flag(s), help, bounds, choices and default, as declared."""
    default, kind = _cli_default(f), _cli_type(hint, opt)
    if default is None:
        kind = kind | None
    if opt.argument:
        info = typer.Argument(help=opt.help)
    else:
        name = options.flag_of(f.name, opt)
        decls = [f"{name}/--no-{name[2:]}" if kind is bool else name] + ([opt.short] if opt.short else [])
        extra = _in(opt.range) if opt.range else _device("auto" in opt.devices) if opt.devices else {}
        info = typer.Option(*decls, help=opt.help or None, **extra)
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, info])


def _values(cls: type, given: dict[str, Any]) -> dict[str, Any]:
    """The config's keywords from parsed options: None (not given) leaves the field's own default."""
    kwargs = {}
    for f, opt in options.declared(cls):
        value = given.get(f.name)
        if opt.comma and value is not None:
            if not value.strip(", "):  # `--outputs ''` meant something, not "the defaults"
                flag = options.flag_of(f.name, opt)
                raise InputError(f"{flag} is empty", flag, f"give a comma list, or leave {flag} out for its default")
            value = value.split(",")
        if value is not None:
            kwargs[f.name] = value
    return kwargs


class _FreeText(TyperCommand):
    """A command whose arguments are free text (kd query's SQL, kd search's query), which may begin with "-": click
    reads any such token as an option, so "-- note\nSELECT 1" (a SQL comment) was "No such option". A token holding
    whitespace before any "=" names no option (--out=my file.parquet does), so it is handed to click masked and
    given back as the text it is; an option's value is click's to read ("-f '- csv'" is refused as that value)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        valued = {o for p in self.params if p.param_type_name == "option" and not getattr(p, "is_flag", False)
                  for o in p.opts}
        nonce = secrets.token_hex(4)  # no user's token is a mask
        masked = [f"kd-text-{nonce}-{i}" if a.startswith("-") and _space_before_equals(a)
                  and (i == 0 or args[i - 1] not in valued) else a for i, a in enumerate(args)]
        texts = {m: a for m, a in zip(masked, args) if m != a}
        try:
            rest = super().parse_args(ctx, masked)
        except Exception as e:  # click's usage errors quote the tokens they refuse: the user's, never a mask
            if isinstance(getattr(e, "message", None), str):
                e.message = functools.reduce(lambda m, t: m.replace(*t), texts.items(), e.message)
            raise
        ctx.params = {k: texts.get(v, v) if isinstance(v, str) else v for k, v in ctx.params.items()}
        return [texts.get(a, a) for a in rest]


def _space_before_equals(token: str) -> bool:
    head = token.split("=", 1)[0]
    return any(c.isspace() for c in head)


def _declared_by(cls: type) -> Callable[[Callable[[Any], None]], Callable[..., None]]:
    """The command's parameters are `cls`'s declared options (`kd.common.options`: flag, help, range and choices
    live on the fields); its body gets the config built from them, and a config's refusal exits 2."""
    hints = typing.get_type_hints(cls)
    params = [_parameter(f, opt, hints[f.name]) for f, opt in options.declared(cls) if opt.cli]

    def wrap(body: Callable[[Any], None]) -> Callable[..., None]:
        def command(**given: Any) -> None:
            try:
                config = cls(**_values(cls, given))
            except ValueError as e:  # bad enum values (a Python caller's, or one typer let through)
                _fail(KdError(str(e)))
            body(config)

        # typer reads the signature (inspect.signature) and the annotations (get_type_hints) of `command`
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        command.__name__, command.__qualname__, command.__doc__ = body.__name__, body.__qualname__, body.__doc__
        return command

    return wrap


@contextlib.contextmanager
def _starting(command: str, enabled: bool) -> Iterator[None]:
    """A line while torch, transformers' BERT code and the teacher pass are first imported (10-20 s on a loaded
    core: the first silence of the README's commands); the command's own imports follow in the block."""
    from kd.common.progress import step

    with step(f"{command}: loading torch and transformers", enabled):
        import transformers.models.bert.modeling_bert  # noqa: F401

        import kd.pipeline.precompute  # noqa: F401  (torch, transformers, the backends)

        yield


@app.callback()
def _options(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option("--debug", envvar="KD_DEBUG", help="Show the Python traceback of an error")] = False,  # noqa: E501
    verbose: Annotated[bool, typer.Option("--verbose", envvar="KD_VERBOSE", help="Show transformers' and Hugging Face's own logs, warnings and progress bars")] = False,  # noqa: E501
) -> None:
    from kd.common.quiet import set_verbose

    set_verbose(verbose)  # before any command imports transformers: they read it then
    ctx.obj = {"debug": debug}


def main() -> None:  # pragma: no cover - console entry for `python -m kd`
    try:
        app()
    except Exception as e:  # what escapes outside a command (the commands' own are `_Commands.invoke`'s)
        err = as_kd_error(e)
        if err is None or _debug():
            raise
        console.print(_tagged("error:", "bold red", err))
        sys.exit(err.exit_code)


# --- stage one: precompute, info, validate --------------------------------------------------------
# (precompute commands)
@app.command()
@_declared_by(PrecomputeJob)
def precompute(job: PrecomputeJob) -> None:
    """Run teachers over a corpus once and write their outputs to a Parquet store.

    Grow a store with only the new options: kd precompute --add-to STORE -t mpnet --outputs vocab,init
    """
    from kd.pipeline.precompute import run

    try:
        s = run(job)
    except ValueError as e:  # bad enum values (dtype, precision, shard index)
        _fail(KdError(str(e)))
    if s.nothing_to_do:
        term.print(f"store {s.store} is already complete for {', '.join(s.teachers)}: nothing to do")
        return
    if s.vocab_written:
        term.print(f"wrote the per-teacher outputs (vocab / init) of {', '.join(s.vocab_written)}")
    if s.files_written and not s.shards_written:  # (a fresh store writes them too: not worth a line there)
        term.print(f"restored {', '.join(s.files_written)}")
    term.print(
        f"wrote {s.shards_written} shard(s) to {s.store}: {s.rows_computed:,} rows encoded of {s.rows_total:,} "
        # each teacher encodes every row, and its truncated rows are its own: two teachers over 300 rows said
        # "600 rows encoded of 300" (probe)
        + (f"x {len(s.teachers)} teachers " if len(s.teachers) > 1 else "")
        + (f"and {s.rows_reused:,} copied from --reuse " if s.rows_reused else "")
        + f"({s.shards_skipped} shard(s) already done); dropped {s.empty_dropped} empty, "
        f"{s.duplicates_dropped} duplicate; {s.truncated} truncated; {s.seconds:.1f} s, "
        f"{s.rate:,.{0 if s.rate >= 10 else 1}f} rows/s, "  # (a slow teacher's 0.3 rows/s is not "0 rows/s")
        f"{s.bytes_written / 1e6:.1f} MB" + (f"; {s.retried} unit(s) retried (their worker died)" if s.retried else "")
        + ("; rows per Ray node: " + ", ".join(f"{n[:12]}={r:,}" for n, r in s.rows_per_node.items())
           if s.rows_per_node else "")
    )


@app.command()
@_declared_by(InfoConfig)
def info(cfg: InfoConfig) -> None:
    """Print a store's manifest summary: inputs, tables, shards, teachers."""
    from kd.storage.info import info as summary

    term.print(summary(cfg))


@app.command()
@_declared_by(ValidateConfig)
def validate(cfg: ValidateConfig) -> None:
    """Re-check checksums, schemas and id alignment of every shard; exit 1 on any problem."""
    from kd.storage.validate import validate_store

    res = validate_store(cfg)
    for line in res.repaired:
        term.print(_tagged("repair", "yellow", line))
    for p in res.problems:
        term.print(_tagged("problem", "red", p))
    for p in res.notes:
        term.print(_tagged("note", "yellow", p))
    if res.problems:
        raise typer.Exit(1)
    term.print(_tagged("ok", "green", f"{cfg.store}: every shard matches the manifest"))

# --- stage two: train-student, embed ---------------------------------------------------------------
# (student commands)
@app.command("train-student")
@_declared_by(TrainConfig)
def train_student(cfg: TrainConfig) -> None:
    """Train a student from a store's teacher outputs (the teacher is never loaded). DDP under torchrun."""
    from kd.student.trainer import train

    try:
        path = train(cfg)
    except ValueError as e:  # bad enum values (schedule, init-embeddings)
        _fail(KdError(str(e)))
    if int(os.environ.get("RANK", "0")) == 0:
        term.print(f"student ready in {path}")  # (written, or there already: train says "nothing to do")


@app.command()
@_declared_by(LeakageConfig)
def leakage(cfg: LeakageConfig) -> None:
    """Check a store against the evaluation sets: which rows are STS-B / SST-2 / clustering texts?"""
    from rich.table import Table

    from kd.apps.leakage import leakage as check

    res = check(cfg)
    table = Table("evaluation set", "texts", "found in the store", "store rows")
    for name, (n, found, rows) in res.sets.items():
        table.add_row(name, f"{n:,}", f"{found:,} ({100 * found / max(1, n):.1f} %)", f"{rows:,}")
    term.print(table)
    term.print(f"{len(res.ids):,} of {res.rows:,} store rows overlap an evaluation set")
    if cfg.exclude_out:
        written = local_path(cfg.exclude_out)  # the file, as a shell reads it (a space broke the pasted line: probe)
        term.print(f"their ids are in {written}: kd train-student ... --exclude-ids {shlex.quote(str(written))}",
                   highlight=False)


@app.command()
@_declared_by(EmbedConfig)
def embed(cfg: EmbedConfig) -> None:
    """Write a student's vectors: an aligned table students/NAME of a store, or a Parquet file."""
    from kd.student.embed import run

    s = run(cfg)
    where = f"table {s.table} of {s.output}" if s.table else s.output
    term.print(f"embedded {s.rows:,} rows into {where} ({s.shards_written} shard(s) written, "
               f"{s.shards_skipped} already done; {s.seconds:.1f} s)")


@app.command("export")
@_declared_by(ExportConfig)
def export_cmd(cfg: ExportConfig) -> None:
    """Write a student as a sentence-transformers directory or an ONNX model (same vectors; --quantize int8: close)."""
    from kd.student.exporters import export

    res = export(cfg)
    term.print(f"{cfg.format} export written to {res.path}")
    if res.note:  # the student is no chain of sentence-transformers' modules, or one with a limit (issue 49)
        term.print(_tagged("note:", "yellow", res.note))


# --- evaluation and demo -------------------------------------------------------------------------
# (eval commands)
def _wide() -> Console:
    """The results console; piped or logged output gets 200 columns so the table is not squashed, unless COLUMNS
    says how wide the reader is (the table then splits to fit: EvalReport.rich_table)."""
    return term if term.is_terminal or os.environ.get("COLUMNS") else Console(width=200, markup=False)


@app.command("eval")
@_declared_by(EvalConfig)
def eval_(cfg: EvalConfig) -> None:
    """Compare teacher, students (and a baseline) on STS, agreement, neighbours, clustering, probe, speed."""
    from kd.apps.eval.run import evaluate

    report = evaluate(cfg)
    out = _wide()
    out.print(report.rich_table(out.width))
    for key, note in report.info.items():
        if isinstance(note, str):
            term.print(Text(f"{key}: {note}", style="dim"))


@app.command()
@_declared_by(DemoConfig)
def demo(cfg: DemoConfig) -> None:
    """Precompute MiniLM on a bundled corpus, train a static and a BiLSTM student, evaluate all on STS-B dev."""
    with _starting("kd demo", cfg.progress):
        from kd.apps.demo.run import run_demo

    res = run_demo(cfg)
    out = _wide()
    out.print(res.report.rich_table(out.width))
    secs = ", ".join(f"{k} {v:.0f} s" for k, v in res.seconds.items())
    term.print(Text.assemble(f"demo finished ({secs}); best STS-B dev: the ", (str(res.best), "bold"),
                             " student. Everything is in ", (str(res.out), "bold"),
                             f": store/, students/{{{','.join(res.students)}}}/, report.md, report.json, plots/"))


@app.command()
@_declared_by(DistillConfig)
def distill(cfg: DistillConfig) -> None:
    """One command from a corpus to a served student: precompute, leakage, every recipe stage, the choice on dev,
    export and the evaluation suite. Kill it anywhere; the same command resumes."""
    cfg.plan()  # a bad recipe is refused before transformers and the teacher pass load (~2 s where it was ~15)
    with _starting("kd distill", cfg.progress):
        from kd.apps.distill.plan import estimate
        from kd.apps.distill.run import distill as run_distill

    if cfg.dry_run:
        term.print(estimate(cfg).table())
        return
    res = run_distill(cfg)
    if res.report is not None:
        term.print((res.out / "report.md").read_text(encoding="utf-8"))
    term.print(Text.assemble(f"distilled: {res.choice or res.chosen}; everything is in ", (str(res.out), "bold")))
    if res.model is not None:
        term.print(f"the model: {res.model}; load it with: SentenceTransformer({str(res.model)!r})", highlight=False)


# --- the store as a dataset: query, index, search, cluster ---------------------------------------
# (dataset commands)
_data_out = Console(markup=False)  # results of the dataset commands go to stdout


@app.command("query", cls=_FreeText)
@_declared_by(QueryConfig)
def query_cmd(cfg: QueryConfig) -> None:
    """Query the store with DuckDB SQL (views: texts, one per table, outputs). See docs/queries.md."""
    from kd.apps.query_shell import shell

    if shell(cfg, _data_out, sys.stdin):
        raise typer.Exit(1)


@app.command("index")
@_declared_by(IndexConfig)
def index_cmd(cfg: IndexConfig) -> None:
    """Build a faiss cosine index of a vector column, saved in the store."""
    from kd.dataset.index import index_store

    info = index_store(cfg, chosen=console.print)
    _data_out.print(f"indexed {info.rows:,} rows of {info.table}.{info.column} ({info.kind}, {info.device})")
    _data_out.print(f"saved {info.file}")


@app.command("search", cls=_FreeText)
@_declared_by(SearchConfig)
def search_cmd(cfg: SearchConfig) -> None:
    """Top-k texts of the store nearest to a query (build the index first with kd index)."""
    from rich.table import Table

    from kd.apps.search import search_store

    res = search_store(cfg)
    t = Table("rank", "score", "id", "text", caption=f"index {res.index.name}")
    for rank, (i, s, text) in enumerate(zip(res.ids[0], res.scores[0], res.texts[0]), 1):
        if s > float("-inf"):  # -inf: an approximate index found fewer than k rows
            t.add_row(str(rank), f"{s:.4f}", str(i), text)
    _data_out.print(t)


@app.command("cluster")
@_declared_by(ClusterConfig)
def cluster_cmd(cfg: ClusterConfig) -> None:
    """Agglomerative clustering (cosine, average linkage) into table derived/clusters-<table>-<column>."""
    from kd.dataset.cluster import cluster

    s = cluster(cfg)
    _data_out.print(
        f"{s.rows:,} rows -> {s.clusters:,} clusters ({s.method}; largest {s.largest:,}, {s.singletons:,} singletons) "
        f"in {s.table}"
    )


# --- task teachers and fine-tuning ---------------------------------------------------------------
# (finetune commands)
def _metric_text(metrics: dict) -> str:
    shown = [f"{k} {v:.2f}" for k, v in metrics.items() if k != "n"]
    return f"dev {', '.join(shown)} (n={metrics.get('n', 0)})" if shown else "no --dev set: last epoch kept"


@app.command("finetune-teacher")
@_declared_by(TeacherFinetuneConfig)
def finetune_teacher_cmd(cfg: TeacherFinetuneConfig) -> None:
    """Fine-tune a task teacher (a cross-encoder for pairs) that kd precompute --teacher DIR runs for logits."""
    from kd.pipeline.teacher.finetune import finetune_teacher

    s = finetune_teacher(cfg)
    labels = f"labels {s.label_names}" if s.label_names else "one score"
    term.print(f"teacher written to {s.out} ({s.task}, {labels}; {s.train_rows:,} rows, {s.steps} steps, "
               f"{s.seconds:.0f} s); {_metric_text(s.dev_metrics)}")


@app.command("finetune")
@_declared_by(FinetuneConfig)
def finetune_cmd(cfg: FinetuneConfig) -> None:
    """Fine-tune a student with an MLP head on a labelled task (SRA); with --kd-store also match a teacher (SRA+KD)."""
    from kd.student.finetune import finetune

    s = finetune(cfg)
    kd = f", KD from {s.kd_teacher}" if s.kd_teacher else ""
    term.print(f"fine-tuned student written to {s.out} ({s.task}{kd}; {s.train_rows:,} rows, {s.steps} steps, "
               f"{s.seconds:.0f} s); {_metric_text(s.dev_metrics)}")


_ = Path

if __name__ == "__main__":
    main()
