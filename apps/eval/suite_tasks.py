"""The `kd eval` suite's tasks beyond STS-B, probe and clustering: MRPC, Lee document similarity, title retrieval.

- Same shape as eval.py's `_sts`/`_probe`/`_cluster`: the teacher's vectors first (store, cache or the model;
  none without a teacher), then every other model on the same texts, each number put in that model's row beside
  the teacher's.
- Every choice (MRPC's threshold) is made on a train split; test splits are only scored.
- Arguments are eval.py's objects, untyped here: importing eval.py would make an import cycle.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from kd.apps.eval import metrics, tasks
from kd.common.errors import InputError

RETRIEVAL_K = 10


def _models(teacher, others, texts: list[str], bars, what: str) -> tuple[list[tuple[Any, Any]], str]:
    """(model, vectors of `texts`) for the teacher (when there is one) and every other model, and where the
    teacher's came from ("teacher vectors from the cache", or "no teacher")."""
    return teacher.encoded(others, texts, bars, what)


def _not_run(key: str, why: str, rows, info) -> None:
    """Every row's cells of this measure say why they are empty (eval.py reads details[measure] as the note)."""
    info[key] = why
    for r in rows.values():
        r.details[key] = why


def mrpc(cfg, teacher, others, rows, info, bars) -> None:
    """MRPC: cosine threshold chosen on train (accuracy), accuracy and F1 ×100 on test (both splits cut to
    --max-pairs). Not bundled (non-commercial licence): without the shared data the cells say so."""
    try:
        train, test = [tasks.load_mrpc(s).head(cfg.max_pairs) for s in tasks.MRPC_SPLITS]
    except InputError as e:
        _not_run("mrpc", f"not run: MRPC data not found ({e.where}): set KD_SHARED to the folder holding data/ "
                         "(MRPC's licence forbids shipping it with kd)", rows, info)
        return
    texts = train.a + train.b + test.a + test.b
    n, m = len(train.a), len(test.a)
    models, src = _models(teacher, others, texts, bars, "mrpc")
    for model, v in models:
        tr = metrics.rowwise_cosine(v[:n], v[n : 2 * n])
        te = metrics.rowwise_cosine(v[2 * n : 2 * n + m], v[2 * n + m :])
        res = metrics.pair_classification(tr, train.scores, te, test.scores)
        rows[model.name].put("mrpc_accuracy", res.accuracy, v)
        rows[model.name].put("mrpc_f1", res.f1, v)
        rows[model.name].details["mrpc"] = asdict(res)
    info["mrpc"] = (f"MRPC: cosine threshold chosen for accuracy on {n} train pairs, accuracy and F1 on {m} test "
                    f"pairs; {src}")


def lee(cfg, teacher, others, rows, info, bars) -> None:
    """Lee document similarity: Pearson ×100 of the cosine matrix with the human one (upper triangle)."""
    task = tasks.load_lee()
    models, src = _models(teacher, others, task.docs, bars, "lee")
    for model, v in models:
        rows[model.name].put("lee_pearson", metrics.matrix_pearson(v, task.sims), v)
    n = len(task.docs)
    info["lee"] = (f"Lee et al. 2005: {n} news documents (truncated by each model), Pearson with the mean human "
                   f"similarity over {n * (n - 1) // 2} pairs; {src}")


def retrieval(cfg, teacher, others, rows, info, bars) -> None:
    """News titles retrieving their own article (its lead) among all sampled articles: recall@10 and MRR."""
    task = tasks.load_title_retrieval(cfg.retrieval_articles or tasks.RETRIEVAL_ARTICLES)
    n = len(task.queries)
    models, src = _models(teacher, others, task.queries + task.docs, bars, task.name)
    for model, v in models:
        s = metrics.retrieval_scores(v[:n], v[n:], RETRIEVAL_K)
        rows[model.name].put("retrieval_recall", s.recall_at_k, v)
        rows[model.name].put("retrieval_mrr", s.mrr, v)
    info["retrieval"] = (f"{n} news titles, each retrieving its own article (first {tasks.RETRIEVAL_SENTENCES} "
                         f"sentences) among {n} by exact cosine search; ties count against the query; "
                         f"{src}")


def suite_text_sets() -> list[list[str]]:
    """The text lists the default suite hands each model, one per task, exactly as `kd eval --task suite` builds
    them (the teacher's vectors are cached per list, apps/eval/cache.py; tests/apps/test_distill.py holds them
    equal): what `kd distill --dry-run` times the step by, and looks up in the cache."""
    sts, sst = tasks.load_stsb("test"), tasks.load_sst2()
    cluster, retrieval = tasks.load_cluster_set(), tasks.load_title_retrieval()
    documents = tasks.load_cluster_set(tasks.ClusterSet.brown_documents)
    sets = [sts.a + sts.b, sst.train_texts + sst.test_texts, cluster.dev_texts + cluster.test_texts,
            documents.dev_texts + documents.test_texts, tasks.load_lee().docs, retrieval.queries + retrieval.docs]
    try:
        train, test = [tasks.load_mrpc(s) for s in tasks.MRPC_SPLITS]
        sets.append(train.a + train.b + test.a + test.b)
    except InputError:
        pass  # not run without the shared data
    return sets
