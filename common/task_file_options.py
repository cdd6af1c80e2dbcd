"""The options of a labelled task file (which columns, which delimiter), declared once for the two fine-tuning
commands, `kd finetune` and `kd finetune-teacher` (kd.common.options: each call is one config field).

Only the standard library and kd.common are imported here: `kd --help` reads this module.
"""

from __future__ import annotations

from typing import Any

from kd.common.options import option


def dev() -> Any:
    return option(None, help="Dev file(s), scored after every epoch")


def text_column() -> Any:
    return option(None, help="Text column (name, or 0-based index without header)")


def pair_columns() -> Any:
    return option(None, help="Two columns a,b for pair tasks, e.g. 5,6 for STS-B")


def label_column() -> Any:
    return option(None, help="Label column (default: label)")


def delimiter() -> Any:
    return option(None, help="Field delimiter for .csv/.tsv (default: sniffed)")
