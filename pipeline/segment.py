"""Split documents into sentences with spaCy.

- Default: `spacy.blank("en")` + the rule-based `sentencizer` (fast, no model download).
- `--spacy-model NAME` uses an installed trained pipeline (e.g. en_core_web_sm); its parser gives
  better boundaries. Only the components needed for sentence boundaries are kept.
"""

from __future__ import annotations

from kd.common.errors import InputError
from kd.common.inputs import require_text_size
from kd.pipeline.inputs import Records
from kd.storage.schema import DOCUMENT  # a whole document's `position`


def load_segmenter(model: str | None):
    import spacy

    if not model or model == "sentencizer":
        nlp = spacy.blank("en")
        nlp.add_pipe("sentencizer")
        return nlp
    try:
        nlp = spacy.load(model, exclude=["ner", "lemmatizer", "textcat"])
    except OSError as e:
        raise InputError(f"spaCy pipeline {model!r} is not installed", None,
                         f"pip install the package that provides {model}, or drop --spacy-model") from e
    if not nlp.has_pipe("parser") and not nlp.has_pipe("senter") and not nlp.has_pipe("sentencizer"):
        nlp.add_pipe("sentencizer")
    nlp.max_length = max(nlp.max_length, 5_000_000)
    return nlp




def segment(records: Records, model: str | None = None, batch_size: int = 256, documents: bool = False) -> Records:
    """Replace each document by its sentences; doc_id is kept and `positions` counts sentences. With `documents`
    the document itself follows its sentences as one more row, at position DOCUMENT: a student then learns the
    teacher's vectors of whole documents too, not only of ~25-token sentences (issue 50: sentence-only students
    served long documents worse than MiniLM). A one-sentence document is its sentence's row alone."""
    nlp = load_segmenter(model)
    out = Records()
    positions: list[int] = []

    def add(text: str, label, doc_id: str, source, pos: int) -> None:
        require_text_size((text,), doc_id)  # (its document's file and line)
        out.texts.append(text)
        out.labels.append(label)
        out.doc_ids.append(doc_id)
        out.sources.append(source)
        positions.append(pos)

    raw = [t if isinstance(t, str) else str(t) for t in records.texts]
    docs = nlp.pipe(raw, batch_size=batch_size)
    for doc, text, label, doc_id, source in zip(docs, raw, records.labels, records.doc_ids, records.sources):
        sentences = [s.text.strip() for s in doc.sents if s.text.strip()]
        for pos, sentence in enumerate(sentences):
            add(sentence, label, doc_id, source, pos)
        if documents and len(sentences) > 1:  # a one-sentence document is already its sentence's row
            add(text.strip(), label, doc_id, source, DOCUMENT)
    out.positions = positions  # type: ignore[attr-defined]
    return out
