"""What a command stopped by Ctrl-C or SIGTERM kept, and the exact command line that resumes it (issue 49).

A stop must never leave a user guessing whether an hour of work is lost: the CLI turns the interrupt into a
`Stopped` (exit 130 / 143) whose message says what is on disk and ends with the command to run next. What each
command keeps is its own design (docs/design.md): precompute commits shards and keeps a shard's finished batches
(`pipeline/teacher/partial.py`), train-student checkpoints, distill and demo resume from their finished steps, embed
commits shards, eval caches the teacher's vectors; export and index build in a temporary place and rename at the
end, so nothing half-written is left and the same command starts over.
"""

from __future__ import annotations

import shlex
import signal
from collections.abc import Callable, Sequence
from typing import Any

from kd.common.stop import Stopped

Kept = Callable[[dict[str, Any]], str]

# command -> (what a stopped run kept, whether the same command continues from it rather than starting over)
_KEPT: dict[str, tuple[Kept, bool]] = {
    "precompute": (lambda p: f"the shards committed to {p.get('out') or p.get('add_to') or 'the store'} and the "
                             "finished batches of the shard in flight are kept", True),
    "train-student": (lambda p: f"the last checkpoint in {p.get('out') or 'the output folder'} is kept (one every "
                                "--checkpoint-every steps and at each epoch's end; none before the first)", True),
    "distill": (lambda p: f"every finished step in {p.get('out') or 'the output folder'} is kept (the store's "
                          "committed shards, each stage's checkpoints and trained students, the choice)", True),
    "demo": (lambda p: f"in {p.get('out') or 'the output folder'}: the store's committed shards (and the "
                       "finished batches of the shard in flight), each finished student and the last checkpoint of "
                       "the one in training are kept", True),
    "embed": (lambda p: "the shards already committed are kept", True),
    "eval": (lambda p: "the teacher's vectors of the sets finished so far are kept in kd's cache folder"
                       + (" (not with --no-cache)" if p.get("cache") is False else "")
                       + "; no report was written", True),
    "export": (lambda p: "nothing: the export is built in a temporary folder beside --out, removed by the next "
                         "run, and --out is unchanged", False),
    "index": (lambda p: "nothing: the index files are written at the end, so the store is unchanged", False),
}
_NOTHING: tuple[Kept, bool] = (lambda p: "nothing of this run is kept", False)

# Options that discard what a stopped run kept: the resume command leaves them out (train-student's --overwrite
# deletes the checkpoint the rerun should continue from, --no-resume ignores it; demo's redoes every stage).
_DISCARDS = {"train-student": ("--overwrite", "--no-resume"), "demo": ("--overwrite",)}


def resume_command(command: str, argv: Sequence[str]) -> str:
    """`kd <argv>` as a shell line, without the options of `command` that would discard the kept work."""
    drop = _DISCARDS.get(command, ())
    return shlex.join(["kd", *(a for a in argv if a not in drop)])


def interrupted(command: str, params: dict[str, Any], signum: int, argv: Sequence[str]) -> Stopped:
    """The Stopped a Ctrl-C (signum SIGINT) or SIGTERM inside `kd <command>` amounts to: what was kept, and how
    to resume (`argv`: the command line after `kd`, `params`: its parsed options, for the paths)."""
    kept, resumes = _KEPT.get(command, _NOTHING)
    fix = "run the same command again to resume" if resumes else "run the same command again"
    return Stopped(signum, f"kd {command} stopped by {signal.Signals(signum).name}: {kept(params)}", None,
                   fix).resuming(resume_command(command, argv))
