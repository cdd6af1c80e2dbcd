"""The contract between the stages: store layout, Arrow schemas, manifest, shard I/O, validation.

`pipeline` (stage one) writes stores and `student` (stage two) reads them; both import this
package and never each other. The names below load on first use (PEP 562), so importing one light
module of the package (e.g. `kd.common.errors` for `kd --help`) does not pull in pyarrow.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "KdError": "kd.common.errors", "StoreError": "kd.common.errors", "FORMAT_VERSION": "kd.storage.manifest",
    "Manifest": "kd.storage.manifest", "ShardRecord": "kd.storage.manifest", "TableRecord": "kd.storage.manifest",
    "Store": "kd.storage.store",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'kd.storage' has no attribute {name!r}")
