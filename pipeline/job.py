"""One `kd precompute` job: every option, checked once, before anything is read, loaded or created.

- `PrecomputeJob` holds the options (the CLI builds one; `precompute.precompute(inputs, out, teachers, **options)`
  builds one for Python callers) and checks them when built (`check`): numeric bounds (kd.common.bounds), the
  device, --out, the choices, the backend combination and the engine flags (`ray_options`);
- what the steps after it need is derived here too (input options that are fingerprinted, how teachers load,
  which outputs are per row and which per teacher), so the engines read one object instead of loose arguments.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kd.common import bounds as B
from kd.common.errors import InputError, KdError
from kd.common.hardware import check_device
from kd.common.options import bounded, check_ranges, check_types, one_value_as_sequence, option
from kd.common.options import flag as option_flag
from kd.pipeline import inputs as inp
from kd.pipeline import ray_probe
from kd.pipeline.teacher.resolve import TeacherRef, TeacherSpec, check_distinct, parse_teacher

if TYPE_CHECKING:
    from kd.storage.schema import VectorDType

ENGINES = B.choices(B.Engine)
PER_TEACHER = ("vocab", "init")  # outputs computed once per teacher, not per row
PROBE_TIMEOUT_S = 8.0  # connect and answer as Ray within this, or the address is refused (issue 41: <= 10 s)
START_FIX = ("start one (`ray start --head`) and pass its address HOST:PORT (the head's GCS port, 6379 by default), "
             "or leave --ray-address and RAY_ADDRESS unset to start a local Ray runtime")


@dataclass(frozen=True)
class RayOptions:
    address: str | None
    workers: int | None
    gpus_per_worker: float | None
    device: str | None  # None (GPU when the cluster has one), cpu or cuda


@dataclass(frozen=True)
class PrecomputeJob:
    """Every option of `kd precompute`, each declared once (flag, help, range: `kd.common.options`); the CLI's
    parameters are built from these fields. Checked when built."""

    inputs: tuple[str, ...] = option((), argument=True, help="Input files or globs: .txt, .jsonl, .csv/.tsv, "
                                                             ".parquet (none with --add-to)")
    # None from Python callers with add_to: the store it names
    out: str = option(None, short="-o", help="Store folder or pyarrow filesystem URI")
    # as given (a Python caller may pass TeacherSpec values): `specs` holds them parsed, what the steps after read
    teachers: tuple[str, ...] = option(("minilm",), flag="--teacher", short="-t",
                                       help="minilm | mpnet | bert-base | DIR | NAME=DIR")
    # row outputs and/or vocab, init; None: the teacher's defaults
    outputs: tuple[str, ...] | None = option(None, comma=True, help="Comma list of cls,mean,layers,sentence,logits,"
                                                                    "vocab,init (default: all but vocab, init)")
    segment: str = option("none", choices=B.Segment, help=B.SEGMENT_HELP)
    spacy_model: str | None = option(None, help="Installed spaCy pipeline for --segment sentences")
    text_column: str | None = option(None, help="Column with the text (name, or 0-based index without header)")
    pair_columns: str | None = option(None, help="Two columns a,b holding sentence pairs")
    label_column: str | None = option(None, help="Optional label column")
    delimiter: str | None = option(None, help="Field delimiter for .csv/.tsv (default: sniffed)")
    dedup: bool = option(False, help="Drop exact duplicate texts")
    # chosen by id: common.ids.in_sample
    sample: float | None = option(None, range=B.SAMPLE, help="Keep this fraction of the rows, chosen by "
                                  "content-hash id: the same subset for every teacher and run")
    batch_tokens: int | None = option(None, range=B.BATCH_TOKENS, help="Token budget per batch (padded length x "
                                      "rows; default: 4096 on CPU, 16384 on GPU)")
    max_length: int | None = option(None, range=B.TOKENS, help="Truncate texts to this many tokens")
    shard_rows: int = option(20000, range=B.ROWS, help="Rows per shard (the unit of resume and scale-out)")
    num_shards: int | None = option(None, range=B.SHARDS, help="Number of writers (default: torchrun WORLD_SIZE "
                                                               "or 1)")
    shard_index: int | None = option(None, range=B.SHARD_INDEX, help="This writer's 0-based index (default: "
                                                                     "torchrun RANK or 0)")
    dtype: str = option("float32", choices=B.VectorDType, help="float32 | float16 | int8 for stored vectors (int8: "
                        "per-vector scale, read back as float32; logits stay float32)")
    precision: str = option("auto", choices=B.Precision, help="auto | fp32 | bf16 | fp16 forward precision; auto: "
                            "fp16 on CUDA, bf16 on CPUs with native bf16 (AMX/AVX512-BF16), else fp32")
    device: str | None = option(None, devices=B.DEVICES[1:], help="cpu | cuda | cuda:N (default: cuda when present)")
    overwrite: bool = option(False, help="Replace the whole store when it was made from other inputs or row settings "
                             "(a teacher's other settings on the same inputs: --teacher NEW=PATH or a new --out)")
    progress: bool = option(True, help="Show a progress bar")
    keep_layers: str | None = option(None, help="Layers the init output keeps, e.g. 2,5 (default: half, evenly "
                                                "spaced, ending with the last)")
    # the rule: pipeline/backends/choice.py
    backend: str = option("auto", choices=B.Backend, help="auto | torch | onnx | openvino: what runs the teacher's "
                          "forward pass (onnx/openvino: exported once to $KD_CACHE, CPU); auto: openvino on a CPU "
                          "where installed (torch if its fidelity is too low), else torch")
    quantize: str = option("none", choices=B.Quantize, help="none | int8 (onnx: dynamic quantization; openvino: "
                           "static int8 on CPUs with VNNI/AMX, int8 weights elsewhere)")
    threads: int | None = bounded(None, B.THREADS)
    allow_low_fidelity: bool = option(False, help="Keep a backend whose cosine to torch fp32 is below the threshold")
    engine: str = option("local", choices=B.Engine, help="local (this process) | ray (a pool of Ray workers; "
                         "pip install 'kd\\[ray]')")
    ray_address: str | None = option(None, help="--engine ray: auto | HOST:PORT of a running cluster (default: "
                                                "RAY_ADDRESS, else a local Ray runtime)")
    workers: int | None = option(None, range=B.RAY_WORKERS, help="--engine ray: workers (default: one per GPU, "
                                                                 "else one per CPU)")
    gpus_per_worker: float | None = option(None, range=B.GPU_SHARE, help="--engine ray: GPUs each worker reserves "
                                                                         "(default 1; 0.5: two per GPU)")
    # copied, not encoded: reuse.py
    reuse: str | None = option(None, remote=True,
                               help="Store whose rows of the same teachers (same settings) are copied instead of "
                                    "encoded again: a grown corpus costs only its new rows")
    # out = this store; grow.py
    add_to: str | None = option(None, remote=True,
                                help="Grow this store in place with only the new options (-t, --outputs): no inputs, "
                                     "its recorded input files (unchanged, same sha256) and row options are reused; "
                                     "its rows are not encoded again")
    # the Ray engine's options (None: the local engine), set from the flags above once they passed `check`
    ray: RayOptions | None = field(init=False, default=None, repr=False)
    # the teachers parsed once (a TeacherRef given, already found on this machine, is kept: loading it finds nothing
    # again)
    specs: tuple[TeacherSpec | TeacherRef, ...] = field(init=False, default=(), repr=False)

    def __post_init__(self) -> None:
        one_value_as_sequence(self)
        check_types(self, "kd precompute options")  # before the lists are read: `outputs=5` from Python
        # lists from Python callers become tuples: a job cannot change after its checks
        for name in ("inputs", "teachers", "outputs"):
            value = getattr(self, name)
            object.__setattr__(self, name, None if value is None else tuple(value))
        object.__setattr__(self, "out", self._out())
        object.__setattr__(self, "ray", self.check())
        object.__setattr__(self, "specs", tuple(t if isinstance(t, TeacherRef) else parse_teacher(t)
                                                for t in self.teachers))
        check_distinct([t if isinstance(t, TeacherSpec) else t.spec for t in self.specs], _flag("teachers"))
        object.__setattr__(self, "teachers", tuple(str(s) for s in self.specs))

    def check(self) -> RayOptions | None:
        """Refuse unusable options, in this order: numeric bounds, the device (local engine: Ray workers check
        their own GPUs, this driver may have none), --out, --segment, the teachers, --dtype (a ValueError),
        the inputs against --add-to, --reuse, the backend combination, the engine flags (`ray_options`, which
        returns the Ray engine's options).
        Reads nothing but `os.path.isfile(out)` (and, for a Ray address, connects to it once)."""
        # imported here, not at the top: the CLI reads this module's fields for `kd --help`, which must not
        # load numpy/pyarrow
        from kd.pipeline.backends import runtime as backends
        from kd.storage.schema import VectorDType

        check_ranges(self, "kd precompute options")
        if self.engine == "local":
            check_device(self.device)
        if os.path.isfile(self.out):
            raise InputError("--out is an existing file, not a store folder", self.out, "pass a folder path")
        if self.segment not in B.choices(B.Segment):
            raise InputError(f"unknown --segment {self.segment!r}", None, f"use one of: {B.SEGMENT_HELP}")
        if not self.teachers:
            raise InputError("no teacher given", None, "pass --teacher minilm (or a checkpoint directory)")
        if self.keep_layers is not None and not self.wants("init"):  # it would be silently unused
            raise InputError(f"{_flag('keep_layers')} chooses the layers of the init output, which this run does not "
                             "write", f"{_flag('keep_layers')} {self.keep_layers}", "add init to --outputs, or drop "
                             f"{_flag('keep_layers')}")
        VectorDType(self.dtype)
        self._check_add_to()
        self._check_reuse()
        backends.check_options(self.backend, self.quantize, self.precision, self.device)
        return ray_options(self.engine, self.ray_address, self.workers, self.gpus_per_worker, self.num_shards,
                           self.shard_index, self.device)

    def _out(self) -> str:
        """--out as a path: --add-to's store when only that is given; both must name the same store."""
        out, grow = (None if p is None else os.fspath(p) for p in (self.out, self.add_to))
        if grow is not None:
            object.__setattr__(self, "add_to", grow)
            if out is not None and os.path.abspath(out) != os.path.abspath(grow):
                raise InputError("--out and --add-to name different stores", f"--out {out}, --add-to {grow}",
                                 "drop --out: --add-to writes into the store it names")
        if out is None and grow is None:
            raise InputError("no --out given", _flag("out"), "pass --out STORE (or --add-to STORE to grow a store)")
        return out or grow or ""

    def _check_add_to(self) -> None:
        """--add-to takes the store's inputs, and keeps the store: no inputs, no --overwrite."""
        if self.add_to is None:
            if not self.inputs:
                raise InputError("no input files given", None, "pass one or more files (kd precompute corpus.txt "
                                 "-o STORE), or --add-to STORE to add outputs or teachers to a store")
            return
        if self.inputs:
            raise InputError("--add-to reuses the store's own inputs, but inputs were given too", _flag("add_to"),
                             "drop the inputs, or pass them with -o STORE instead of --add-to")
        if self.overwrite:
            raise InputError("--overwrite would delete the store --add-to grows", _flag("add_to"), "drop --overwrite")

    def _check_reuse(self) -> None:
        if self.reuse is None:
            return
        if self.engine != "local":
            raise InputError("--reuse runs with the local engine only", _flag("reuse"),
                             "drop --engine ray, or --reuse (the Ray workers encode every row)")
        if os.path.abspath(self.reuse) == os.path.abspath(self.out):
            raise InputError("--reuse names the output store itself", _flag("reuse"),
                             "drop --reuse: a rerun into the same store already skips every committed shard")

    @property
    def vdtype(self) -> VectorDType:
        from kd.storage.schema import VectorDType

        return VectorDType(self.dtype)

    @property
    def row_outputs(self) -> list[str] | None:
        """The per-row outputs asked for; None: the teachers' defaults."""
        return [o for o in self.outputs if o not in PER_TEACHER] if self.outputs else None

    def wants(self, output: str) -> bool:
        """Whether per-teacher output `output` (vocab, init) was asked for."""
        return bool(self.outputs) and output in self.outputs

    @property
    def only_per_teacher(self) -> bool:
        """Only vocab/init were asked for: each teacher's row outputs stay what the store holds."""
        return (self.wants("vocab") or self.wants("init")) and not self.row_outputs

    def columns(self) -> inp.ColumnSpec:
        """Which input fields hold the text, the pair and the label (--pair-columns parsed: an InputError)."""
        return inp.ColumnSpec(self.text_column, inp.parse_pair_columns(self.pair_columns), self.label_column,
                              self.delimiter)

    def input_options(self, spec: inp.ColumnSpec) -> dict[str, Any]:
        """The options that shape the rows: fingerprinted with the input files."""
        options = {"text_column": self.text_column, "pair_columns": spec.pair, "label_column": self.label_column,
                   "segment": self.segment, "spacy_model": self.spacy_model if self.segment != "none" else None,
                   "dedup": self.dedup, "shard_rows": self.shard_rows,
                   "delimiter": spec.delimiter}  # the character read (`'\t'` typed is a tab): one store either way
        if self.sample is not None:  # only when set: stores made without it keep their fingerprint
            options["sample"] = self.sample
        return options

    def load_options(self) -> dict[str, Any]:
        """Keywords of `loading.load` (pipeline/backends/loading.py) for each teacher."""
        return dict(backend=self.backend, quantize=self.quantize, device=self.device, precision=self.precision,
                    max_length=self.max_length, threads=self.threads, allow_low_fidelity=self.allow_low_fidelity,
                    engine=self.engine)


def _flag(name: str) -> str:
    """A job option's flag, for a refusal's `where` (declared once, on the field)."""
    return option_flag(PrecomputeJob, name)


def ray_options(engine: str, address: str | None, workers: int | None, gpus_per_worker: float | None,
                num_shards: int | None, shard_index: int | None, device: str | None) -> RayOptions | None:
    """Check the engine flags before anything is read or loaded; None for the one-process engine."""
    if engine not in ENGINES:
        raise InputError(f"unknown --engine {engine!r}", _flag("engine"), "use local (one process) or ray")
    given = [_flag(name) for name, v in (("ray_address", address), ("workers", workers),
                                         ("gpus_per_worker", gpus_per_worker)) if v is not None]
    if engine == "local":
        if given:
            raise InputError(f"{', '.join(given)} only applies to --engine ray", given[0],
                             f"add --engine ray, or drop {', '.join(given)}")
        return None
    if num_shards is not None or shard_index is not None:
        raise InputError("--engine ray assigns shards to its workers itself; --num-shards/--shard-index split a "
                         "store between independent processes", "--engine ray",
                         "drop --num-shards/--shard-index (use --workers N), or drop --engine ray")
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        raise InputError("--engine ray runs one driver; this process is one rank of a torchrun job "
                         f"(WORLD_SIZE={os.environ['WORLD_SIZE']})", "--engine ray",
                         "start kd precompute --engine ray once, without torchrun")
    if device not in (None, "cpu", "cuda"):
        raise InputError(f"--device {device} cannot be used with --engine ray: Ray gives each worker its own GPU",
                         _flag("device"), "use --device cuda (each worker on its GPU), --device cpu, or leave it unset")
    if device == "cpu" and gpus_per_worker is not None:
        raise InputError("--gpus-per-worker with --device cpu", _flag("gpus_per_worker"),
                         "drop --gpus-per-worker, or use --device cuda")
    if address is not None and not address.strip():  # '' would reach ray.init, which fails after the store is made
        raise InputError("--ray-address is empty", _flag("ray_address"),
                         "pass the head's HOST:PORT (e.g. 10.0.0.5:6379), auto, or drop --ray-address")
    require_ray()
    env = os.environ.get("RAY_ADDRESS")
    if address or env:  # before anything is read or written: a dead address would make ray.init retry for minutes
        probe_address(address or env, f"--ray-address {address}" if address else f"RAY_ADDRESS={env}")
    return RayOptions(address, workers, gpus_per_worker, device)


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise KdError("--engine ray needs ray, which is not installed", "--engine ray",
                      "pip install 'kd[ray]'") from None
    return ray


def probe_address(address: str, where: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Refuse a Ray address that does not answer as Ray within `timeout` seconds (`ray_probe.check`).

    ray.init retries a dead address for many minutes, and one that accepts TCP but is not Ray (a web server)
    for longer; a connect to HOST:PORT (`ray://HOST:PORT` too, IPv6 in brackets) answers at once when nothing
    listens and within `timeout` when the host drops packets, and one gRPC exchange tells a Ray GCS from
    anything else. `auto` and `local` are left to Ray.
    """
    if address in ("auto", "local"):
        return
    if address.startswith("ray://") and importlib.util.find_spec("grpc") is None:  # what Ray Client needs
        raise KdError(f"{address} is a Ray Client address, and Ray Client is not installed", where,
                      "pip install 'ray[client]', or pass the head's GCS address HOST:PORT (6379 by default)")
    host, sep, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InputError(f"the Ray address {address!r} is not HOST:PORT", where,
                         "pass the head's HOST:PORT (e.g. 10.0.0.5:6379), auto, or leave it unset")
    try:
        ray_probe.check(host.strip("[]"), int(port), timeout, gcs=not address.startswith("ray://"))
    except OSError as e:
        raise KdError(f"no Ray cluster answers at {address} ({e.strerror or e})", where, START_FIX) from None
    except ray_probe.NotRay as e:
        raise KdError(f"{address} does not answer as a Ray cluster: {e}", where,
                      f"check the port (`ray status` on the head shows it); {START_FIX}") from None
