"""Stage two: train small student encoders from a store's precomputed teacher outputs.

Never imports `pipeline` or any transformers model class: a student trains from Parquet shards alone.
"""
