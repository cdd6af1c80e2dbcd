"""kd: offline knowledge distillation of sentence and document encoders.

The repository root is the `kd` package (pyproject maps `kd` to `.`), so the installed names are
`kd`, `kd.pipeline`, `kd.student`, `kd.storage`, `kd.apps`, `kd.common` and `kd.cli`, and nothing else
lands at the top level of site-packages. Importing `kd` is cheap: subpackages load on first use.

    import kd
    store = kd.precompute(["corpus.txt"], "emb", teachers=["minilm"])
    model = kd.train_student(store, "runs/bilstm", arch="bilstm")
    vectors = model.encode(["a sentence", "another one"])   # or kd.student.load("runs/bilstm")
"""

__version__ = "0.1.0"

# The two stages and a whole recipe (kd distill), one call each (kd.apps.api), loaded on first use so that
# `import kd` stays cheap.
__all__ = ["distill", "precompute", "train_student"]


# Subpackages a user reaches as attributes (`import kd; kd.student.load(...)`), imported on first use too.
SUBPACKAGES = ("student", "dataset", "storage", "pipeline", "apps", "common")


def __getattr__(name: str):
    if name in __all__:
        from kd.apps import api

        return getattr(api, name)
    if name in SUBPACKAGES:
        import importlib

        return importlib.import_module(f"kd.{name}")
    raise AttributeError(f"module 'kd' has no attribute {name!r}")
