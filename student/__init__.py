"""Stage two: train small student encoders from a store's precomputed teacher outputs.

Never imports `pipeline` or any transformers model class: a student trains from Parquet shards alone.

    from kd import student
    model = student.load("runs/bilstm")       # a folder written by `kd train-student`
    vectors = model.encode(["a sentence", "another one"])
    st_model = student.load_exported("runs/bilstm-st")  # a `kd export --format sentence-transformers`
                                                        # folder, without trust_remote_code (student.st_load)
"""

from kd.student.saved import LoadedStudent, load
from kd.student.st_load import load_exported

__all__ = ["LoadedStudent", "load", "load_exported"]
