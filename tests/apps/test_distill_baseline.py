"""Issue 50: `kd distill` never exports a student worse than its baseline (the recipe's first student, untrained).
A stage whose training ends below its start on STS-B dev loses the choice to the baseline: the run exports the
baseline and says so."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from single_thread import one_thread  # noqa: F401  (autouse: one thread, so the scores are reproducible)
from typer.testing import CliRunner

from kd.apps.distill import recipe as R
from kd.cli import app
from kd.common.errors import InputError

# A static student from the random teacher's vocab output, trained hard onto the teacher's own sentence vectors:
# it learns them well (loss ~0.003) and so ends at the random teacher's quality, below its PCA + SIF start.
RECIPE = """description = "training that makes the student worse"
teacher = "{teacher}"
target = "mean"

[outputs]
teacher = ["mean", "vocab"]

[[stage]]
name = "worse"
from = "teacher"
arch = "static"
embed_dim = 32
objectives = ["cosine"]
lr = 1.0
epochs = 30
batch_size = 16
val_percent = 0
patience = 0
"""


@pytest.fixture()
def corpus(tmp_path, sentences) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(sentences[:160]) + "\n", encoding="utf-8")
    return path


def test_training_that_makes_the_student_worse_exports_the_baseline_and_says_so(tmp_path, corpus, tiny_teacher):
    from sentence_transformers import SentenceTransformer

    from kd.student.saved import load

    recipe = tmp_path / "worse.toml"
    recipe.write_text(RECIPE.format(teacher=tiny_teacher), encoding="utf-8")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(out), "--recipe", str(recipe)])
    assert res.exit_code == 0, res.output
    choice = json.loads((out / "choice.json").read_text())
    scores = choice["sts_dev"]
    assert scores["worse"] < scores[R.BASELINE] - 1.0, scores  # the premise: training lost on dev
    assert choice["chosen"] == R.BASELINE and choice["candidates"] == [R.BASELINE, "worse"]
    said = " ".join(res.output.split())
    assert "chose the baseline" in said and "training did not beat it" in said, said
    assert f"{scores[R.BASELINE]:.2f}" in said and f"{scores['worse']:.2f}" in said
    texts = ["the market fell sharply", "a dog runs in the park", "stocks dropped"]
    served = SentenceTransformer(str(out / "model"), device="cpu").encode(texts)
    np.testing.assert_allclose(served, _unit(load(out / "stages" / R.BASELINE).encode(texts)), atol=1e-5)
    assert not np.allclose(served, _unit(load(out / "stages" / "worse").encode(texts)), atol=1e-3)
    # the evaluation that fits the run (no --suite): STS-B dev and test of the chosen student and its baseline,
    # here one and the same, so one row; the card says which was chosen
    report = json.loads((out / "report.json").read_text())
    assert [(m["name"], m["sts_dev"]) for m in report["models"]] == [(R.BASELINE, round(scores[R.BASELINE], 2))]
    assert 0 < report["models"][0]["sts_test"] <= 100 and "STS-B test" in (out / "report.md").read_text()
    assert "Chosen: **baseline**" in (out / "model" / "README.md").read_text()


def test_the_report_shows_the_baseline_beside_a_chosen_stage(tmp_path, corpus, tiny_teacher):
    """The report's rows when a stage is chosen: that stage, then the baseline. On a random teacher no training
    passes its start on dev, so the choice is rewritten to the stage and the evaluation step alone run again (a
    rerun redoes the steps distill.json does not list as done)."""
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.format(teacher=tiny_teacher).replace("epochs = 30", "epochs = 1"), encoding="utf-8")
    out = tmp_path / "run"
    args = ["distill", str(corpus), "-o", str(out), "--recipe", str(recipe), "--no-export"]
    assert CliRunner().invoke(app, args).exit_code == 0
    choice_file, state_file = out / "choice.json", out / "distill.json"
    choice, state = json.loads(choice_file.read_text()), json.loads(state_file.read_text())
    choice_file.write_text(json.dumps(choice | {"chosen": "worse"}))
    # (recorded as the choose step's own: an edit alone makes the rerun choose again)
    sha = hashlib.sha256(choice_file.read_bytes()).hexdigest()
    files = state["files"] | {"choose on STS-B dev": {"choice.json": sha}}
    state_file.write_text(json.dumps(state | {"done": [s for s in state["done"] if s != "evaluate on STS-B"],
                                              "files": files}))
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = json.loads((out / "report.json").read_text())["models"]
    assert [(r["name"], r["sts_dev"]) for r in rows] == [("worse", round(choice["sts_dev"]["worse"], 2)),
                                                          (R.BASELINE, round(choice["sts_dev"][R.BASELINE], 2))]
    assert rows[0]["sts_test"] != rows[1]["sts_test"]  # two students, each read on test
    said = " ".join(res.output.split())
    assert f"chose stage worse: STS-B dev {choice['sts_dev']['worse']:.2f}" in said and "over the baseline" in said


def test_a_stage_may_not_take_the_baselines_name(tmp_path, tiny_teacher):
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.format(teacher=tiny_teacher).replace('name = "worse"', 'name = "baseline"'))
    with pytest.raises(InputError, match="kd.s own"):
        R.load(str(recipe))


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)



def test_a_transformer_baseline_is_the_start_model_itself(tmp_path, corpus, tiny_teacher):
    """Its own width and no head: the vectors of the start model (masked mean of its last layer), not a least-squares
    map of them onto the teacher's space (which scored below MiniLM itself on STS-B dev)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from kd.student.saved import load

    recipe = tmp_path / "r.toml"
    recipe.write_text(f'description = "t"\nteacher = "{tiny_teacher}"\nstart = "{tiny_teacher}"\ntarget = "mean"\n'
                      '[outputs]\nteacher = ["mean"]\nstart = ["init"]\nkeep_layers = "0,1"\n'
                      '[[stage]]\nname = "two"\nfrom = "start"\narch = "transformer-init"\ninit_layers = "0,1"\n'
                      'out_dim = 48\nmax_steps = 2\nbatch_size = 8\n', encoding="utf-8")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(out), "--recipe", str(recipe), "--no-export",
                                   "--no-evaluate"])
    assert res.exit_code == 0, res.output
    base = load(out / "stages" / R.BASELINE)
    assert base.dim == 32 and load(out / "stages" / "two").dim == 48  # the start's width; the stage's own
    texts = ["the market fell sharply", "a dog runs in the park"]
    tok, model = AutoTokenizer.from_pretrained(tiny_teacher), AutoModel.from_pretrained(tiny_teacher).eval()
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    want = ((h * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(base.encode(texts), _unit(want), atol=1e-5)


MEASURED = "\n[measured]\nrows = [1000, 50000]\nbeat_baseline = [false, true]\n"


@pytest.mark.parametrize("rows,warned", [(160, True), (49_999, True), (50_000, False), (10**6, False)])
def test_the_size_warning_follows_the_recipes_measurements(tmp_path, tiny_teacher, rows, warned):
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.format(teacher=tiny_teacher).replace("\n[outputs]", MEASURED + "\n[outputs]"))
    note = R.load(str(recipe)).size_warning(rows)
    assert (note is not None) == warned
    if warned:
        assert f"{rows:,} rows" in note and "from 50,000 rows on (not at 1,000)" in note


@pytest.mark.parametrize("block", ["\n[measured]\nrows = [1000]\nbeat_baseline = [false, true]\n",
                                   "\n[measured]\nrows = [-5]\nbeat_baseline = [true]\n",
                                   "\n[measured]\nrows = [1000]\nbeat_baseline = [1]\n",
                                   "\n[measured]\nsizes = [1000]\n"])
def test_a_bad_measured_table_is_refused_when_the_recipe_is_read(tmp_path, tiny_teacher, block):
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.format(teacher=tiny_teacher).replace("\n[outputs]", block + "\n[outputs]"))
    with pytest.raises(InputError, match=r"\[measured\]"):
        R.load(str(recipe))


def test_the_dry_run_warns_below_the_size_where_the_preset_beat_its_baseline(tmp_path, corpus, tiny_teacher):
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.format(teacher=tiny_teacher).replace("\n[outputs]", MEASURED + "\n[outputs]"))
    res = CliRunner().invoke(app, ["distill", str(corpus), "-o", str(tmp_path / "run"), "--recipe", str(recipe),
                                   "--dry-run", "--no-evaluate", "--no-export"])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "note: a corpus of 160 rows" in said and "from 50,000 rows on" in said and "export the baseline" in said


def test_the_choice_line_names_the_best_candidate_not_a_stage_that_could_not_be_exported():
    """tiny3's 6-layer stages are a means, never its result: when the baseline wins, the line names the best
    stage of the final shape (a 1,000-sentence tiny3 run said "best stage relational", a 6-layer stage)."""
    from kd.apps.distill.run import choice_line

    scores = {R.BASELINE: 86.72, "cosine": 86.36, "relational": 86.47, "three-layer": 82.40}
    line = choice_line(R.BASELINE, scores, [R.BASELINE, "three-layer"])
    assert "best stage three-layer: 82.40" in line and "relational" not in line, line
    assert "chose stage three-layer: STS-B dev 82.40, -4.32" in choice_line("three-layer", scores,
                                                                             [R.BASELINE, "three-layer"])


def test_each_preset_s_measured_sizes_are_those_of_the_corpus_size_table():
    """What `--dry-run` warns from (a preset's [measured]) is what docs/corpus-sizes.json recorded for it (written
    by bench/corpus_sizes.py from the runs): the same corpus sizes, and beat_baseline where the best stage of the
    recipe's final shape passed the baseline on STS-B dev. A new measurement changes both or the test fails."""
    points = json.loads((Path(__file__).resolve().parents[2] / "docs" / "corpus-sizes.json").read_text())
    assert {p["preset"] for p in points} <= set(R.PRESETS)
    for name in R.PRESETS:
        recorded = {p["rows"]: p["best_dev"] > p["baseline_dev"] for p in points if p["preset"] == name}
        assert dict(R.load(name).measured) == recorded, name
