"""kd: offline knowledge distillation of sentence and document encoders.

The repository root is the `kd` package (pyproject maps `kd` to `.`), so the installed names are
`kd`, `kd.pipeline`, `kd.student`, `kd.storage`, `kd.apps`, `kd.common` and `kd.cli`, and nothing else
lands at the top level of site-packages. Importing `kd` is cheap: subpackages load on first use.

    from kd import student
    vectors = student.load("runs/bilstm").encode(["a sentence", "another one"])
"""

__version__ = "0.1.0"
