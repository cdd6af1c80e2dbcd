"""The options of `kd train-student`: `TrainConfig` (saved as training_args.json), checked when built, and the
per-arch defaults the CLI and the demo fill in where the user gave no value."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from kd.common import bounds as B
from kd.common.errors import InputError
from kd.common.hardware import check_device


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
    auto = "auto"  # lstsq for transformer-init students whose head is one linear layer, else random
    lstsq = "lstsq"  # the least-squares map from the start model's pooled vectors to the target (student.head_fit)
    random = "random"  # PyTorch's default initialisation


# Defaults that differ by arch, applied where the user gave no value (`arch_defaults`). A static student
# has far fewer computations per parameter: large batches and a high rate, no dropout on its only layer.
ARCH_DEFAULTS: dict[str, dict[str, Any]] = {
    "static": {"embed_dim": 256, "batch_size": 256, "lr": 5e-3, "dropout": 0.0, "epochs": 3, "weight_decay": 0.0},
    # pretrained layers: a small rate (BERT fine-tuning range), BERT's own dropout only
    "transformer-init": {"batch_size": 64, "lr": 1e-4, "dropout": 0.0, "epochs": 1, "weight_decay": 0.01},
}


TUNED = ("embed_dim", "dropout", "epochs", "batch_size", "lr", "weight_decay")  # the options ARCH_DEFAULTS sets


def arch_defaults(arch: str, given: dict[str, Any], init: bool = False) -> dict[str, Any]:
    """`given` with the arch's defaults filled in for every key whose value is None (with `init` the
    --init student's embed_dim stands, not the arch's)."""
    base = {"batch_size": 64, "lr": 1e-3, "dropout": 0.1, "epochs": 3, "weight_decay": 0.01}
    base |= ARCH_DEFAULTS.get(arch, {})
    if init:
        base.pop("embed_dim", None)
    return {k: (base.get(k) if v is None else v) for k, v in given.items()}


@dataclass
class TrainConfig:
    """Every option of `kd train-student`; saved as training_args.json."""

    store: str
    out: str
    arch: str = "bilstm"
    objectives: list[str] = field(default_factory=lambda: ["cosine"])
    target: str | None = None  # "<teacher>.<column>"; default: the teacher's default_target
    embed_dim: int | None = None  # default: min(300, the teacher's input-embedding width)
    hidden_dim: int | None = None  # None: StudentConfig's default
    out_dim: int | None = None  # embedding width; None: the target's width (no target: the encoder's width)
    init: str | None = None  # a trained student folder to start from (same arch and tokenizer)
    num_layers: int = 1
    pooling: str = "mean"
    dropout: float | None = None  # None: the arch's default (ARCH_DEFAULTS, `arch_defaults`)
    max_length: int = 128
    student: dict[str, Any] = field(default_factory=dict)  # other StudentConfig fields
    epochs: int | None = None  # None: the arch's default
    max_steps: int | None = None  # overrides epochs
    batch_size: int | None = None  # None: the arch's default
    lr: float | None = None  # None: the arch's default
    weight_decay: float | None = None  # None: the arch's default
    warmup: float = 0.05  # < 1: fraction of the steps; >= 1: steps
    schedule: Schedule = Schedule.cosine
    clip: float = 1.0  # max gradient norm; 0 disables
    patience: int = 3  # evaluations without improvement before stopping; 0: never stop early
    eval_every: int | None = None  # steps; None: at each epoch end
    checkpoint_every: int = 500
    log_every: int = 20
    seed: int = 0
    num_workers: int = 0
    shuffle_buffer: int = 10_000
    val_percent: float = 2.0
    max_val_rows: int = 2_000
    device: str = "auto"
    amp: bool = True  # autocast on CUDA only (bf16 where supported, else fp16 + GradScaler)
    init_embeddings: EmbeddingInit = EmbeddingInit.auto
    head_init: HeadInit = HeadInit.auto
    token_weights: str = "sif"  # static students: sif (frequent tokens count less) | none
    exclude_ids: str | None = None  # file of row ids never trained or validated on (`kd leakage --exclude-out`)
    init_layers: str | None = None  # transformer-init: which stored init output ("2,5"); default: the only one.
    # With --init: which of that student's layers the new one keeps (a smaller copy); default: all
    # stored teacher whose tokenizer, embeddings, vocab/init outputs the student starts from (`source_teacher`);
    # None: the target's teacher, or for transformer-init the one teacher with an init output
    init_teacher: str | None = None
    bucket: bool = True  # length-bucketed batches inside the shuffle buffer (student.data._bucketed)
    resume: bool = True
    overwrite: bool = False
    progress: bool = True

    # options that may differ between a run and its resumption (the rest must match)
    RESUMABLE = ("epochs", "max_steps", "patience", "eval_every", "checkpoint_every", "log_every", "device",
                 "progress", "resume", "overwrite")

    def __post_init__(self) -> None:
        # The arch's defaults are filled in here, the one place: the CLI, the demo and the Python API pass None
        # for what the user left out, so every door trains the same student from the same options.
        tuned = arch_defaults(self.arch, {k: getattr(self, k) for k in TUNED}, init=self.init is not None)
        for k, v in tuned.items():
            setattr(self, k, v)
        self.schedule = Schedule(self.schedule)
        self.init_embeddings = EmbeddingInit(self.init_embeddings)
        self.head_init = HeadInit(self.head_init)
        B.check("train-student options", ("--embed-dim", self.embed_dim, B.WIDTH),
                ("--hidden-dim", self.hidden_dim, B.WIDTH), ("--out-dim", self.out_dim, B.WIDTH),
                ("--layers", self.num_layers, B.LAYERS), ("--dropout", self.dropout, B.DROPOUT),
                ("--max-length", self.max_length, B.TOKENS), ("--epochs", self.epochs, B.EPOCHS),
                ("--max-steps", self.max_steps, B.STEPS), ("--batch-size", self.batch_size, B.BATCH),
                ("--lr", self.lr, B.STUDENT_LR), ("--weight-decay", self.weight_decay, B.WEIGHT_DECAY),
                ("--warmup", self.warmup, B.WARMUP), ("--clip", self.clip, B.CLIP),
                ("--patience", self.patience, B.PATIENCE), ("--eval-every", self.eval_every, B.STEPS),
                ("--checkpoint-every", self.checkpoint_every, B.STEPS), ("--log-every", self.log_every, B.STEPS),
                ("--seed", self.seed, B.SEED), ("--workers", self.num_workers, B.LOADER_WORKERS),
                ("--shuffle-buffer", self.shuffle_buffer, B.ROWS), ("--val-percent", self.val_percent, B.PERCENT),
                ("max_val_rows", self.max_val_rows, B.ROWS))
        if not self.objectives:
            raise InputError("no objective given", "--objective", "e.g. --objective cosine")
        if self.token_weights not in B.choices(B.TokenWeights):
            raise InputError(f"unknown --token-weights {self.token_weights!r}", "--token-weights", "use sif or none")
        check_device(self.device)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["schedule"], d["init_embeddings"] = self.schedule.value, self.init_embeddings.value
        d["head_init"] = self.head_init.value
        return d
