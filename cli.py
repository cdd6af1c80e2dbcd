"""`kd` command line: thin. Each command parses options, calls one library function, prints.

All logic lives in `pipeline`, `student`, `storage` and `apps`, importable and tested without the CLI.
Heavy imports (torch, transformers) happen inside commands so `kd --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional  # noqa: F401  (Optional: typer needs it on py3.10 annotations)

import typer
from rich.console import Console

from storage.errors import KdError

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Offline knowledge distillation of sentence encoders.")
console = Console(stderr=True)
out = Console()


def _fail(e: KdError) -> None:
    console.print(f"[bold red]error:[/] {e}")
    raise typer.Exit(2)


def main() -> None:  # pragma: no cover - console entry for `python -m cli`
    try:
        app()
    except KdError as e:
        console.print(f"[bold red]error:[/] {e}")
        sys.exit(2)


# --- stage one: precompute, info, validate --------------------------------------------------------
# (precompute commands)

# --- stage two: train-student, embed ---------------------------------------------------------------
# (student commands)

# --- evaluation and demo -------------------------------------------------------------------------
# (eval commands)

# --- the store as a dataset: query, index, search, cluster ---------------------------------------
# (dataset commands)

# --- task teachers and fine-tuning ---------------------------------------------------------------
# (finetune commands)

_ = Path

if __name__ == "__main__":
    main()
