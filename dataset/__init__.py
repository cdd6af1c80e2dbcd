"""The store as a dataset, above the store contract: SQL views (`query`, DuckDB), vector indexes and search
(`index`, faiss), clustering into derived tables (`cluster`).

Imports kd.common and kd.storage; imported by kd.apps and kd.cli, never by pipeline, student or storage
(the index files' record and checks, which validate and repair need, are kd.storage.index_files).
"""
