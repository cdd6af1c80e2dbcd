"""The contract between the stages: store layout, Arrow schemas, manifest, shard I/O, validation.

`pipeline` (stage one) writes stores and `student` (stage two) reads them; both import this
package and never each other.
"""

from kd.storage.errors import KdError, StoreError
from kd.storage.manifest import FORMAT_VERSION, Manifest, ShardRecord, TableRecord
from kd.storage.store import Store

__all__ = ["FORMAT_VERSION", "KdError", "Manifest", "ShardRecord", "Store", "StoreError", "TableRecord"]
