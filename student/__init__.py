"""Stage two: train small student encoders from a store's precomputed teacher outputs.

Never imports `pipeline` or any transformers model class: a student trains from Parquet shards alone.

    from kd import student
    model = student.load("runs/bilstm")       # a folder written by `kd train-student`
    vectors = model.encode(["a sentence", "another one"])
"""

from kd.student.export import LoadedStudent, load

__all__ = ["LoadedStudent", "load"]
