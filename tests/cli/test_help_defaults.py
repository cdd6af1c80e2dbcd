"""Every option with a default shows it in `kd CMD --help` (issue 49: "every defaulted option shows its default").

A default hidden from the help is a default the user must read the code for; the test walks every command's
options, so a new option (or a new command) is held to it too.
"""

from __future__ import annotations

import click
import pytest
import typer
from typer.testing import CliRunner

from kd.cli import app

GROUP = typer.main.get_command(app)


def _shown(value: object) -> bool:
    """Whether a default is one to show: None, False of a plain flag and an empty list say 'not given'."""
    return value is not None and value != [] and value != ()


def _chunks(help_text: str) -> dict[str, str]:
    """Each option's rows of the help panel, by its first flag."""
    chunks: dict[str, str] = {}
    name = None
    for line in help_text.splitlines():
        body = line.strip("│ ").strip()
        first = body.split()[0] if body.split() else ""
        if first.startswith("-") and not first.startswith("--no-") or first.startswith("*"):
            name = body.lstrip("* ").split()[0]
            chunks[name] = ""
        if name is not None:
            chunks[name] += " " + body
    return chunks


@pytest.mark.parametrize("name", sorted(GROUP.commands))
def test_every_defaulted_option_shows_its_default(name):
    command = GROUP.commands[name]
    res = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert res.exit_code == 0, res.output
    chunks = _chunks(res.output)
    missing = []
    for p in command.params:
        if not isinstance(p, click.Option) or p.hidden or not _shown(p.default):
            continue
        flag = max(p.opts, key=lambda o: o.startswith("--"))
        chunk = chunks.get(flag, "")
        if "[default:" not in chunk and "(default:" not in chunk:
            missing.append(f"{flag} (default {p.default!r})")
    assert not missing, f"kd {name} --help hides the default of: {', '.join(missing)}"
