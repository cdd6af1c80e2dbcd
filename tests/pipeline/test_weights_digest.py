"""pipeline.teacher.model.weights_sha256: one hash per weights per process (a kd distill run hashed its teacher's
weights four times: checked against the store, loaded, its export cache, its eval cache), and weights written since
are hashed again, even where the copy kept the old file's size and modification time."""

import builtins
import hashlib
import os
import shutil

from conftest import build_tiny_bert

from kd.pipeline.teacher import model


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_checkpoint_is_hashed_once_until_its_weights_are_written(tmp_path, monkeypatch):
    teacher = build_tiny_bert(tmp_path / "t")
    other = build_tiny_bert(tmp_path / "o", seed=5)
    weights = teacher / "model.safetensors"
    assert weights.stat().st_size == (other / "model.safetensors").stat().st_size
    opened = []
    real_open = builtins.open

    def counting_open(file, *args, **kwargs):
        opened.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(model, "open", counting_open, raising=False)  # (the module's reads only)
    first = model.weights_sha256(str(teacher))
    assert first == _sha(weights) and model.weights_sha256(str(teacher)) == first
    assert opened.count(str(weights)) == 1
    # another checkpoint's weights copied over it with the old size and modification time: hashed again
    stat = weights.stat()
    shutil.copyfile(other / "model.safetensors", weights)
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights.stat().st_mtime_ns == stat.st_mtime_ns and weights.stat().st_ino == stat.st_ino
    assert model.weights_sha256(str(teacher)) == _sha(other / "model.safetensors") != first
    assert opened.count(str(weights)) == 2
