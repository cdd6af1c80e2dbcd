"""Every option of `kd finetune-teacher`, declared once (flag, help, range, choices: kd.common.options); saved as
finetune_args.json. Light to import: `kd --help` builds the command from these fields."""

from __future__ import annotations

from dataclasses import dataclass

from kd.common import bounds as B
from kd.common import task_file_options as T
from kd.common.hardware import check_device
from kd.common.options import bounded, check_ranges, one_value_as_sequence, option


@dataclass
class TeacherFinetuneConfig:
    base: str = option(help="minilm | mpnet | bert-base | DIR: the encoder to fine-tune")
    task: str = option(choices=B.Task, help="pair-regression | pair-classification | classification")
    train: list[str] = option(path=True, help="Training file(s): .tsv/.csv/.jsonl/.parquet with labels")
    out: str = option(short="-o", help="Output folder: a Hugging Face checkpoint")
    dev: list[str] | None = T.dev()
    epochs: int = option(3, range=B.EPOCHS)
    lr: float = option(2e-5, range=B.LR)
    batch_size: int = option(16, range=B.BATCH)
    max_steps: int | None = option(None, range=B.STEPS, help="Stop after this many steps (overrides --epochs)")
    warmup: float = option(0.1, range=B.WARMUP, help="Warm-up: fraction of steps (<1) or steps (>=1); 0: none")
    weight_decay: float = bounded(0.01, B.WEIGHT_DECAY)
    max_length: int = option(128, range=B.TEACHER_TOKENS, help="Tokens per input (a pair counts both sides)")
    text_column: str | None = T.text_column()
    pair_columns: str | None = T.pair_columns()
    label_column: str | None = T.label_column()
    delimiter: str | None = T.delimiter()
    seed: int = option(0, range=B.SEED)
    device: str | None = option(None, devices=B.DEVICES[1:], help="cpu | cuda | cuda:N (default: cuda when present)")
    eval_batch_size: int = bounded(64, B.BATCH)
    overwrite: bool = option(False, help="Replace a previous kd finetune-teacher output")
    progress: bool = option(True, help="Show a progress bar")

    def __post_init__(self) -> None:
        one_value_as_sequence(self)
        from kd.common.finetune import task_options  # (torch: only when a run is configured, not for --help)

        task_options(self)
        check_ranges(self, "finetune-teacher options")
        check_device(self.device)
