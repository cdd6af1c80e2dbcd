"""Every option of `kd finetune`, declared once (flag, help, range, choices: kd.common.options); saved as
training_args.json. Light to import: `kd --help` builds the command from these fields."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common import bounds as B
from kd.common import task_file_options as T
from kd.common.errors import InputError
from kd.common.hardware import check_device
from kd.common.options import bounded, check_ranges, one_value_as_sequence, option


@dataclass
class FinetuneConfig:
    student: str = option(path=True, help="Student folder written by kd train-student (or kd finetune)")
    task: str = option(choices=B.Task, help="classification | pair-classification | pair-regression")
    train: list[str] = option(path=True, help="Training file(s) with labels")
    out: str = option(short="-o", help="Output folder for the fine-tuned student")
    dev: list[str] | None = T.dev()
    kd_store: str | None = option(None, remote=True,
                                   help="SRA+KD: store over the training file with a task teacher's logits")
    kd_weight: float = option(1.0, range=B.LOSS_WEIGHT, help="Weight of the logit MSE to the teacher (0: off)")
    kd_alpha: float | None = option(None, range=B.UNIT, help="SRA+KD as Tang et al.: alpha x task loss + (1 - alpha) "
                                                             "x logit MSE (replaces --kd-weight)")
    kd_teacher: str | None = option(None, help="Teacher of --kd-store (default: the one with logits)")
    epochs: int = option(3, range=B.EPOCHS)
    lr: float = option(5e-4, range=B.LR, help="SRA picks from 2e-4, 3e-4, 5e-4, 1e-3 on dev")
    batch_size: int = option(32, range=B.BATCH)
    max_steps: int | None = option(None, range=B.STEPS, help="Stop after this many steps (overrides --epochs)")
    hidden: int = option(256, range=B.WIDTH, help="Width of the MLP head's hidden layer (SRA: 256)")
    dropout: float = option(0.1, range=B.DROPOUT)
    weight_decay: float = bounded(0.0, B.WEIGHT_DECAY)
    warmup: float = bounded(0.05, B.WARMUP)  # < 1: fraction of the steps; >= 1: steps
    clip: float = bounded(1.0, B.CLIP)
    text_column: str | None = T.text_column()
    pair_columns: str | None = T.pair_columns()
    label_column: str | None = T.label_column()
    delimiter: str | None = T.delimiter()
    seed: int = option(0, range=B.SEED)
    device: str = option("auto", devices=B.DEVICES, help="auto | cpu | cuda | cuda:N")
    eval_batch_size: int = bounded(256, B.BATCH)
    overwrite: bool = option(False, help="Replace a previous kd finetune output")
    progress: bool = option(True, help="Show a progress bar")

    def __post_init__(self) -> None:
        one_value_as_sequence(self)
        from kd.common.finetune import task_options  # (torch: only when a run is configured, not for --help)

        task_options(self)
        check_ranges(self, "finetune options")
        check_device(self.device)
        if self.kd_alpha is not None and self.kd_store is None:
            raise InputError(f"--kd-alpha {self.kd_alpha} needs a kd store", "--kd-alpha",
                             "pass --kd-store STORE (a store with the task teacher's logits)")
        if self.kd_store is None and self.kd_teacher is not None:
            raise InputError("--kd-teacher names a teacher of --kd-store, and no --kd-store was given",
                             "--kd-teacher", "pass --kd-store STORE too, or drop --kd-teacher")
