"""Reading user corpora lives in `common.inputs` (stage two reads training files with the same code).

Re-exported here so stage one keeps its import path.
"""

from kd.common.inputs import SUFFIXES, ColumnSpec, Records, expand_inputs, parse_pair_columns, read_inputs

__all__ = ["SUFFIXES", "ColumnSpec", "Records", "expand_inputs", "parse_pair_columns", "read_inputs"]
