"""Distillation objectives, combinable with weights: "cosine", "mse:0.5", "contrastive:0.1:tau=0.1".

| name | paper | reads | learns |
|---|---|---|---|
| cosine | SRA eq. 1, news eq. 3 | `<t>.sentence` (or the target column) | projection if widths differ |
| mse | news eq. 2 | same | same |
| contrastive | CoDIR eq. 4-5 | `<t>.layers` | phi_s, phi_t, memory bank |
| logits | CoDIR eq. 2 / Tang et al. | `<t>.logits` | linear classifier head |
| pair | DSE eq. 2-3 | `<ce>.logits` (+ label) | f(u, v) MLP |
| multi-teacher | DvBERT | `<ce_k>.logits` for >= 2 teachers (+ label) | linear pair head |
| relational | RKD (Park et al. 2019) | `<t>.sentence` (or the target column) | nothing: in-batch similarity structure |
| label | CoDIR eq. 1 (L_CE) | `label` | linear classifier (or score) head |

In pair stores the embedding and contrastive objectives use each side's columns (`sentence_a`,
`sentence_b`, `layers_a`, `layers_b`); the logit objectives score the pair from both embeddings.
"""

from kd.student.objectives.base import (
    Context,
    LabelKind,
    Objective,
    ObjectiveName,
    ObjectiveSpec,
    pair_features,
    parse_objective,
)
from kd.student.objectives.build import REGISTRY, build_objectives, required_columns, total_loss
from kd.student.objectives.contrastive import Contrastive, MemoryBank, info_nce
from kd.student.objectives.embedding import Cosine, Mse, cosine_loss, mse_loss
from kd.student.objectives.logits import Label, Logits, LogitsMode, MultiTeacher, Pair, annealing_weight, soft_kl
from kd.student.objectives.relational import Relational, relational_loss

__all__ = [
    "REGISTRY", "Context", "Contrastive", "Cosine", "Label", "LabelKind", "Logits", "LogitsMode", "MemoryBank", "Mse",
    "MultiTeacher", "Objective", "ObjectiveName", "ObjectiveSpec", "Pair", "Relational", "annealing_weight",
    "build_objectives", "cosine_loss", "info_nce", "mse_loss", "pair_features", "parse_objective",
    "relational_loss", "required_columns", "soft_kl", "total_loss",
]
