"""The options of `kd train-student`: `TrainConfig` (saved as training_args.json), each declared once on its field
(the CLI's parameters are built from them), checked when built, with the per-arch defaults filled in where no
value was given."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from kd.common import bounds as B
from kd.common.errors import InputError
from kd.common.hardware import check_device, device_kind
from kd.common.options import bounded, check_ranges, check_types, flag, one_value_as_sequence, option
from kd.common.paths import named_files


class Schedule(str, Enum):
    cosine = "cosine"  # linear warm-up, then cosine decay to 0 at the last step
    plateau = "plateau"  # ReduceLROnPlateau on validation loss (warm-up still applies)
    constant = "constant"  # warm-up, then flat


class EmbeddingInit(str, Enum):
    auto = "auto"  # static: the vocab output if stored; else the teacher's input embeddings (PCA); else random
    teacher = "teacher"  # the teacher's input embeddings, required
    vocab = "vocab"  # the teacher's output for each token alone (`kd precompute --outputs vocab`), required
    random = "random"


class HeadInit(str, Enum):
    auto = "auto"  # lstsq for transformer-init and static students whose head is one linear layer, else random
    lstsq = "lstsq"  # the least-squares map from the start model's pooled vectors to the target (student.head_fit)
    random = "random"  # PyTorch's default initialisation


# The training defaults, one table (issue 52): every arch's, then what differs by arch, applied where the user gave no
# value (`arch_defaults`); StudentConfig, DataConfig and the options' help are derived from it (`default_help`).
BASE_DEFAULTS: dict[str, Any] = {"max_length": 128, "batch_size": 64, "lr": 1e-3, "dropout": 0.1, "epochs": 3,
                                 "weight_decay": 0.01}
# A static student has far fewer computations per parameter: large batches and a high rate, no dropout on its only
# layer.
ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "static": {"batch_size": 256, "lr": 5e-3, "dropout": 0.0, "epochs": 3, "weight_decay": 0.0},
    # pretrained layers: a small rate (BERT fine-tuning range), BERT's own dropout only; max_length None: the start
    # model's own (student.setup), so a student reads a document as far as the model it starts from (issue 50: a
    # student cut at 128 tokens where MiniLM reads 256 served documents worse than the MiniLM it came from)
    "transformer-init": {"batch_size": 64, "lr": 1e-4, "dropout": 0.0, "epochs": 1, "weight_decay": 0.01,
                         "max_length": None},
    # Measured (bench/bilstm_defaults.sh, docs/results.md "One default per arch"): 128-d embeddings, 256 per
    # direction and 64 tokens beat 300/512/128 on STS-B dev (77.84 vs 77.47) at 3.4x its speed and 0.4x its
    # size; max pooling lost (74.15). BiGRU, the same family, takes the same (not measured on its own).
    "bilstm": {"hidden_dim": 256, "max_length": 64, "lr": 2e-3},
    "bigru": {"hidden_dim": 256, "max_length": 64, "lr": 2e-3},
}
# The token-embedding width when --embed-dim is not given: min(this, the teacher's width), so a narrow teacher's
# table is never widened (the recurrent archs' 128: the same measurement as above; a static student's table is the
# PCA of the teacher's vocab output, which cannot widen at all: a 32-wide teacher got "cannot reduce" after its
# whole precompute, in issue 48's probe).
DEFAULT_EMBED_DIM = 300
DEFAULT_HIDDEN_DIM = 512  # the encoder's width when neither --hidden-dim nor the arch's default sets it
ARCH_EMBED_DIM = {"bilstm": 128, "bigru": 128, "static": 256}


# DataLoader workers when --workers is not given on a GPU. A GPU step of a small student takes milliseconds, and
# reading + tokenizing in the step's own process left the first GPU run's H200 12 % busy at batch 64; workers
# prepare batches ahead (prefetch) while the step runs. On a CPU the step needs every core: 0. Fixed rather than
# per machine, since the worker count sets the readers and so the order of the rows.
GPU_WORKERS = 4

# the options ARCH_DEFAULTS sets (a None from the user: the arch's value, else the base's)
TUNED = ("embed_dim", "hidden_dim", "max_length", "dropout", "epochs", "batch_size", "lr", "weight_decay")


def arch_defaults(arch: str, given: dict[str, Any], init: bool = False) -> dict[str, Any]:
    """`given` with the arch's defaults filled in for every key whose value is None (with `init` the
    --init student's widths stand, not the arch's)."""
    base = BASE_DEFAULTS | ARCH_DEFAULTS.get(arch, {})
    if init:  # the --init student's shape stands
        base.pop("embed_dim", None)
        base.pop("hidden_dim", None)
    return {k: (base.get(k) if v is None else v) for k, v in given.items()}


def _embed_dim_help() -> str:
    """"(default: min(300, the teacher's width); bilstm/bigru 128; static 256 in place of 300)", from the table."""
    by_value: dict[int, list[str]] = {}
    for arch, width in ARCH_EMBED_DIM.items():
        by_value.setdefault(width, []).append(arch)
    archs = "; ".join(f"{'/'.join(names)} {width}" for width, names in by_value.items())
    return f"Token embedding width (default: min({DEFAULT_EMBED_DIM}, the teacher's width); {archs} in place of " \
           f"{DEFAULT_EMBED_DIM})"


START_MODELS = "the start model's"  # how the help shows a default taken from the start model (None in the table)


def default_help(key: str) -> str:
    """"(default: 0.001; static 0.005; transformer-init 0.0001; bilstm/bigru 0.002)": the table rendered, so the help
    never drifts from the defaults (archs with the same value share one entry). Parentheses, not brackets: rich reads
    "[default: ...]" as markup and the help showed nothing."""
    base = BASE_DEFAULTS[key]
    by_value: dict[Any, list[str]] = {}
    for arch, values in ARCH_DEFAULTS.items():
        if key in values and values[key] != base:
            by_value.setdefault(values[key], []).append(arch)
    parts = [f"{'/'.join(archs)} {START_MODELS if value is None else format(value, 'g')}"
             for value, archs in by_value.items()]
    return f"(default: {'; '.join([f'{base:g}', *parts])})"


@dataclass
class TrainConfig:
    """Every option of `kd train-student`, each declared once (flag, help, range: `kd.common.options`); saved as
    training_args.json. The CLI's parameters are built from these fields."""

    store: str = option(flag="--shards", short="-s", remote=True, help="Store written by kd precompute")
    out: str = option(short="-o", help="Output folder for the student (and checkpoints)")
    arch: str = option("bilstm", choices=B.Arch,
                       help="bilstm | bigru | cnn | ffn | transformer | static | transformer-init")
    objectives: list[str] = option(factory=lambda: ["cosine"], flag="--objective",
                                   help="NAME[:weight][:k=v], repeatable: cosine (default), mse, contrastive, "
                                        "logits, pair, multi-teacher, relational, label")
    target: str | None = option(None, help="teacher.column the embedding matches (default: the teacher's "
                                           "default_target); several as one: mpnet:0.7,minilm:0.3")
    embed_dim: int | None = option(None, range=B.WIDTH, help=_embed_dim_help())
    hidden_dim: int | None = option(None, range=B.WIDTH, help="Encoder width, per direction for RNNs (default: "
                                    f"{DEFAULT_HIDDEN_DIM}; bilstm/bigru {ARCH_DEFAULTS['bilstm']['hidden_dim']})")
    out_dim: int | None = option(None, range=B.WIDTH, help="Embedding width (default: the target's; no target: "
                                                           "the encoder's)")
    init: str | None = option(None, path=True,
                              help="Start from this trained student folder (same --arch and tokenizer; its shape "
                                   "stands)")
    num_layers: int = option(1, flag="--layers", range=B.LAYERS, help="Encoder layers")
    pooling: str = option("mean", choices=B.Pooling, help="mean | max | attentive | cls")
    # None: the arch's default (ARCH_DEFAULTS, `arch_defaults`), as for epochs, batch_size, lr, weight_decay
    dropout: float | None = option(None, range=B.DROPOUT, help=default_help("dropout"))
    max_length: int | None = option(None, range=B.TOKENS, help="Student tokens per text " + default_help("max_length"))
    student: dict[str, Any] = field(default_factory=dict)  # other StudentConfig fields (library only)
    epochs: int | None = option(None, range=B.EPOCHS, help=default_help("epochs"))
    max_steps: int | None = option(None, range=B.STEPS, help="Stop after this many steps (overrides --epochs)")
    batch_size: int | None = option(None, range=B.BATCH, help=default_help("batch_size"))
    lr: float | None = option(None, range=B.STUDENT_LR,
                              help=default_help("lr") + "; 0: weights stay as initialised")
    weight_decay: float | None = option(None, range=B.WEIGHT_DECAY, help=default_help("weight_decay"))
    warmup: float = option(0.05, range=B.WARMUP, help="Warm-up: fraction of steps (<1) or steps (>=1); 0: none")
    schedule: Schedule = option(Schedule.cosine, choices=B.Schedule, help="cosine | plateau | constant")
    clip: float = option(1.0, range=B.CLIP, help="Max gradient norm (0: off)")
    patience: int = option(3, range=B.PATIENCE, help="Evaluations without improvement before stopping (0: never)")
    eval_every: int | None = option(None, range=B.STEPS, help="Validate every N steps (default: each epoch)")
    checkpoint_every: int = option(500, range=B.STEPS, help="Checkpoint every N steps")
    log_every: int = option(20, range=B.STEPS, help="Metrics record every N steps")
    seed: int = option(0, range=B.SEED)
    num_workers: int | None = option(None, flag="--workers", range=B.LOADER_WORKERS,
                                     help="DataLoader worker processes that read and tokenize ahead of the step "
                                          f"(0: in this process; default: 0 on a CPU, {GPU_WORKERS} on a GPU)")
    shuffle_buffer: int = option(10_000, range=B.ROWS, help="Rows in the shuffle buffer")
    val_percent: float = option(2.0, range=B.PERCENT,
                                help="Held-out percent of rows (by id hash; 0: no validation)")
    max_val_rows: int = bounded(2_000, B.ROWS)
    init_embeddings: EmbeddingInit = option(EmbeddingInit.auto, choices=B.EmbeddingInit,
                                            help="auto | teacher | vocab | random")
    # sif: frequent tokens count less
    token_weights: str = option("sif", choices=B.TokenWeights, help="Static students: sif | none")
    head_init: HeadInit = option(HeadInit.auto, choices=B.HeadInit,
                                 help="The head onto a wider target: auto (lstsq for transformer-init and static) | "
                                      "lstsq (least squares from the start model's vectors) | random")
    exclude_ids: str | None = option(None, path=True, help="File of row ids to leave out (kd leakage --exclude-out)")
    # transformer-init default: the only stored init output; with --init default: all of that student's layers
    init_layers: str | None = option(None, help="transformer-init: which stored init output, e.g. 2,5; with "
                                                "--init, which of that student's layers to keep (a smaller copy)")
    init_teacher: str | None = option(None, help="Stored teacher whose tokenizer, embeddings and vocab/init "
                                                 "outputs the student starts from (default: the target's; "
                                                 "transformer-init: the teacher with an init output)")
    bucket: bool = option(True, help="Batches of similar length inside the shuffle buffer (less padding)")
    device: str = option("auto", devices=B.DEVICES, help="auto | cpu | cuda | cuda:N")
    # CUDA: bf16 where supported, else fp16 + GradScaler
    amp: bool = option(True, help="Mixed precision: CUDA; bf16 for Transformer students on CPUs with native bf16")
    resume: bool = option(True, help="Continue from the checkpoint in --out")
    overwrite: bool = option(False, help="Discard a previous run in --out")
    progress: bool = option(True, help="Show a progress bar")

    # options naming files: a rerun names the same ones however it spells them (common.outputs.named_files)
    PATHS = ("out", "store", "init", "exclude_ids")
    # options that may differ between a run and its resumption (the rest must match)
    RESUMABLE = ("epochs", "max_steps", "patience", "eval_every", "checkpoint_every", "log_every", "device",
                 "progress", "resume", "overwrite", "out")  # (out: the checkpoint lies in it, a folder moved or not)

    def __post_init__(self) -> None:
        one_value_as_sequence(self)
        check_types(self, "train-student options")  # before the arch is looked up: `arch=["a"]` from Python
        # The arch's defaults are filled in here, the one place: the CLI, the demo and the Python API pass None
        # for what the user left out, so every door trains the same student from the same options.
        tuned = arch_defaults(self.arch, {k: getattr(self, k) for k in TUNED}, init=self.init is not None)
        for k, v in tuned.items():
            setattr(self, k, v)
        self.schedule = Schedule(self.schedule)
        self.init_embeddings = EmbeddingInit(self.init_embeddings)
        self.head_init = HeadInit(self.head_init)
        check_ranges(self, "train-student options")
        if self.arch == "static" and self.pooling != "mean":  # its encode and exports always take the mean
            raise InputError(f"--pooling {self.pooling} does not apply to --arch static", "--pooling",
                             "a static student averages its token vectors: leave --pooling at mean")
        if not self.objectives:
            raise InputError("no objective given", flag(TrainConfig, "objectives"), "e.g. --objective cosine")
        if self.token_weights not in B.choices(B.TokenWeights):
            raise InputError(f"unknown --token-weights {self.token_weights!r}", flag(TrainConfig, "token_weights"),
                             "use sif or none")
        check_device(self.device)
        if self.num_workers is None:  # decided here once; the student's record shows the count used
            self.num_workers = GPU_WORKERS if device_kind(self.device) == "cuda" else 0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["schedule"], d["init_embeddings"] = self.schedule.value, self.init_embeddings.value
        d["head_init"] = self.head_init.value
        return d

    def record(self) -> dict[str, Any]:
        """`to_json()` with each of PATHS as the file it names (absolute, links followed): what a run writes to its
        records (.kd-started.json, the checkpoint, training_args.json), so that a rerun from another folder compares
        files, not spellings (a probe: `--shards store` recorded as typed matched another folder's store, and the
        dead run's metrics were deleted)."""
        return named_files(self.to_json(), self.PATHS)
