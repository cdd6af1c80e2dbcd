"""kd's cache folder, one per machine (KD_CACHE, default ~/.cache/kd): what is computed once and reused by every
later run — unpacked teachers and their exported graphs, vocab passes, the reference models' evaluation vectors,
the content verdicts on stores (storage.soundness). Everything in it can be deleted; it is computed again."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    return Path(os.environ.get("KD_CACHE", Path.home() / ".cache" / "kd"))
