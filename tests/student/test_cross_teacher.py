"""Cross-teacher students: tokenizer and initial weights from one stored teacher, the target from another
teacher of another width (issue 26: MiniLM's layers, mpnet's 768-d vector), and several targets at once.

The store (tests/two_teacher_store.py): real news sentences through two tiny random BERTs of different widths and
vocabularies, "small" (32-d, 2 layers, the init output) and "big" (48-d, 3 layers, extra words in its vocabulary).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import two_teacher_store
from single_thread import one_thread  # noqa: F401  (autouse: tiny models run faster on one thread)
from two_teacher_store import train

from kd.pipeline.precompute import precompute

# module fixtures (this module's own): the two teachers and their store
teachers, store = two_teacher_store.teachers, two_teacher_store.store


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def _target(store: Path, teacher: str, n: int) -> tuple[list[str], np.ndarray]:
    from kd.storage.store import Store

    st = Store.open(store)
    texts, vecs = st.read_table("texts", ["id", "text"]), st.read_table(f"teachers/{teacher}", ["id", "mean"])
    assert texts["id"].to_pylist()[:n] == vecs["id"].to_pylist()[:n]
    return texts["text"].to_pylist()[:n], np.stack(vecs["mean"].to_numpy(zero_copy_only=False)[:n])


def test_transformer_init_from_one_teacher_learns_another_teachers_wider_target(store, teachers, tmp_path):
    from transformers import AutoTokenizer

    from kd import student

    res = train(store, tmp_path / "x", "--arch", "transformer-init", "--target", "big.mean", "--lr", "2e-3", steps=60)
    assert res.exit_code == 0, res.output  # no other flag: "small" is the only teacher with an init output
    st = student.load(tmp_path / "x")
    info = json.loads((tmp_path / "x" / "config.json").read_text())
    assert info["tokenizer"] == "small" and info["target"] == ["big.mean"]
    assert st.model.config.bert["hidden_size"] == 32 and st.encode(["a"]).shape == (1, 48)  # a learned 32 -> 48 head
    assert st.tokenizer.get_vocab() == AutoTokenizer.from_pretrained(teachers["small"]).get_vocab()
    texts, want = _target(store, "big", 48)
    curve = [json.loads(x) for x in (tmp_path / "x" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in curve if "loss" in r]
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:5]), losses
    assert _cosines(st.encode(texts), want).mean() > 0.5  # it learned big's space, not small's (other width)


def test_cross_teacher_student_exports_with_the_same_vectors(store, tmp_path, sentences):
    from sentence_transformers import SentenceTransformer

    from kd import student
    from kd.student.exporters.onnx_graph import export_onnx, onnx_encode
    from kd.student.exporters.st_directory import export_sentence_transformers

    assert train(store, tmp_path / "x", "--arch", "transformer-init", "--target", "big.mean", steps=5).exit_code == 0
    want = student.load(tmp_path / "x").encode(sentences[200:240])
    st_dir = export_sentence_transformers(tmp_path / "x", tmp_path / "st")
    got = SentenceTransformer(str(st_dir), device="cpu").encode(sentences[200:240])
    assert got.shape == (40, 48) and _cosines(got, want).min() >= 0.9999
    onnx_dir = export_onnx(tmp_path / "x", tmp_path / "onnx")
    assert _cosines(onnx_encode(onnx_dir, sentences[200:240]), want).min() >= 0.9999


def test_recurrent_student_takes_its_vocabulary_from_the_chosen_teacher(store, teachers, tmp_path):
    from transformers import AutoTokenizer

    from kd import student

    for source in ("small", "big"):
        res = train(store, tmp_path / source, "--arch", "bilstm", "--target", "big.mean", "--init-teacher", source,
                    "--init-embeddings", "teacher", "--embed-dim", "16", "--hidden-dim", "16", steps=3)
        assert res.exit_code == 0, res.output
        st = student.load(tmp_path / source)
        assert len(st.tokenizer) == len(AutoTokenizer.from_pretrained(teachers[source]))
        assert st.encode(["a sentence"]).shape == (1, 48)
    assert len(student.load(tmp_path / "big").tokenizer) > len(student.load(tmp_path / "small").tokenizer)


def test_several_teachers_targets_at_once(store, tmp_path):
    res = train(store, tmp_path / "m", "--arch", "bilstm", "--target", "big.mean", "--objective", "cosine",
                "--objective", "cosine:0.5:target=small.mean", "--embed-dim", "16", "--hidden-dim", "16", steps=40)
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    parts = [r for r in recs if "loss" in r]
    for spec in ("cosine:1", "cosine:0.5:target=small.mean"):  # each teacher's term falls: both spaces are matched
        assert np.mean([p[spec] for p in parts[-10:]]) < 0.9 * np.mean([p[spec] for p in parts[:5]]), spec
    from kd import student

    assert student.load(tmp_path / "m").encode(["a"]).shape == (1, 48)  # the student's width is --target's


def test_cross_teacher_errors(store, teachers, tmp_path):
    res = train(store, tmp_path / "e1", "--arch", "bilstm", "--init-teacher", "nobody", steps=1)
    assert res.exit_code == 2 and "nobody" in res.output and "small" in res.output and "big" in res.output
    res = train(store, tmp_path / "e2", "--arch", "transformer-init", "--init-teacher", "big", "--target", "big.mean",
                steps=1)
    assert res.exit_code == 2 and "init output" in res.output and "--outputs init" in res.output, res.output
    res = train(store, tmp_path / "e3", "--arch", "bilstm", "--objective", "cosine:1:target=nobody.mean", steps=1)
    assert res.exit_code == 2 and "nobody" in res.output and "Traceback" not in res.output
    # a trained student continues only from a teacher that tokenises as it does
    assert train(store, tmp_path / "src", "--arch", "bilstm", "--init-teacher", "small", "--embed-dim", "8",
                 "--hidden-dim", "8", steps=1).exit_code == 0
    res = train(store, tmp_path / "e4", "--arch", "bilstm", "--init", str(tmp_path / "src"), "--init-teacher", "big",
                steps=1)
    assert res.exit_code == 2 and "tokenizer" in res.output
    for name in ("e1", "e2", "e3", "e4"):
        assert not (tmp_path / name / "model.safetensors").exists()


def test_several_init_outputs_need_the_flag(store, teachers, tmp_path):
    import shutil

    both = Path(shutil.copytree(store, tmp_path / "both"))
    texts = store.parent / "news.txt"
    precompute([str(texts)], str(both), [f"big={teachers['big']}"], outputs=["init"], keep_layers="2",
               shard_rows=80, progress=False)
    res = train(both, tmp_path / "a", "--arch", "transformer-init", "--target", "big.mean", steps=1)
    assert res.exit_code == 2 and "several" in res.output and "--init-teacher" in res.output
    res = train(both, tmp_path / "b", "--arch", "transformer-init", "--target", "small.mean", "--init-teacher", "big",
                steps=2)
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert cfg["tokenizer"] == "big" and cfg["student"]["bert"]["hidden_size"] == 48


def test_second_stage_of_a_cross_teacher_student_needs_no_teacher_flag(store, tmp_path):
    """--init of a student trained on small's tokenizer with big's target: the tokenizer comes from the student's
    config.json, not from the target's teacher (which would refuse: big's vocabulary differs)."""
    first = train(store, tmp_path / "one", "--arch", "transformer-init", "--target", "big.mean", steps=8)
    assert first.exit_code == 0, first.output
    second = train(store, tmp_path / "two", "--arch", "transformer-init", "--target", "big.mean",
                   "--init", str(tmp_path / "one"), steps=8)
    assert second.exit_code == 0, second.output
    info = json.loads((tmp_path / "two" / "config.json").read_text())
    assert info["tokenizer"] == "small" and info["target"] == ["big.mean"]
    records = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    assert "head_fit" not in records[0]  # the trained head is kept, not refitted
    # an explicit --init-teacher still wins, and the wrong one is refused as before
    wrong = train(store, tmp_path / "three", "--arch", "transformer-init", "--target", "big.mean",
                  "--init", str(tmp_path / "one"), "--init-teacher", "big", steps=8)
    assert wrong.exit_code == 2 and "tokenizer differs" in wrong.output, wrong.output


def test_a_student_continues_on_a_grown_store_of_its_target_teacher_alone(store, teachers, tmp_path, sentences):
    """The recipe for more text: grow the corpus with the big teacher alone (--reuse copies the rows it had), then
    --init the cross-teacher student there. The store lacks "small", so the student's own tokenizer serves."""
    from kd import student

    grown = tmp_path / "grown.txt"
    grown.write_text("\n".join(sentences[:240]) + "\n", encoding="utf-8")
    s = precompute([str(grown)], str(tmp_path / "g"), [f"big={teachers['big']}"], shard_rows=80, progress=False,
                   reuse=str(store))
    assert s.rows_reused >= 150 and s.rows_computed >= 70
    first = train(store, tmp_path / "one", "--arch", "transformer-init", "--target", "big.mean", steps=8)
    assert first.exit_code == 0, first.output
    second = train(tmp_path / "g", tmp_path / "two", "--arch", "transformer-init", "--target", "big.mean",
                   "--init", str(tmp_path / "one"), steps=20)
    assert second.exit_code == 0, second.output
    info = json.loads((tmp_path / "two" / "config.json").read_text())
    args = json.loads((tmp_path / "two" / "training_args.json").read_text())
    assert info["tokenizer"] == "small" and args["resolved"]["train_rows"] > 200  # (rows of the grown store)
    one, two = student.load(tmp_path / "one"), student.load(tmp_path / "two")
    assert one.tokenizer.get_vocab() == two.tokenizer.get_vocab()
    texts, want = _target(tmp_path / "g", "big", 48)
    assert not np.allclose(one.encode(texts), two.encode(texts))  # it trained on
    # with no student to take the tokenizer from, a store without "small" cannot start a small-tokenizer student
    fresh = train(tmp_path / "g", tmp_path / "three", "--arch", "transformer-init", "--target", "big.mean", steps=2)
    assert fresh.exit_code == 2, fresh.output
