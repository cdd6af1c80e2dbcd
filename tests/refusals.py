"""The one check of an input the readers refuse, shared by the input tests: the refusal is an InputError that says
every expected thing (file and line, what is wrong) and how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kd.common.errors import InputError
from kd.common.inputs import ColumnSpec, read_inputs


def read_refused(path: Path, spec: ColumnSpec, *needles: str) -> str:
    """Reading `path` with `spec` is refused with a message holding every one of `needles` and a fix; the message."""
    with pytest.raises(InputError) as e:
        read_inputs([str(path)], spec)
    msg = str(e.value)
    assert all(n in msg for n in needles) and "fix:" in msg, msg
    return msg
