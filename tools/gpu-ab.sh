#!/usr/bin/env bash
# A/B of the per-layer bench (benchmarks/kimi_k3/bench.py, --candidate kernels) between a base commit and the working
# tree, in one device run: each variant in processes of its own, the two alternating round after round, so that their
# ratio is measured on one machine in one run (medians from different runs or cards are not comparable). Two halves:
#   here, on the CPU machine:  tools/gpu-ab.sh prepare <base rev>   # .ab/base/: <rev>'s kimi_k3_path, benchmarks and
#                                                                   # gatekeeper (git archive); .ab/ is git-ignored
#   on the device, carry [".cute", ".whl", ".ab"]:
#     [LAYERS=kda_moe,mla_moe] [TPS=8,16] [BATCH=1] [CONTEXT=4096] [ROUNDS=2] [REPLAYS=200] bash tools/gpu-ab.sh run
# The run writes $OUT/ab-<base|tree>-<round>.json (PerfEvidence, commit 0000000 for base, 1111111 for the tree: they
# are probes, never evidence of record), $OUT/ab.log (every bench's output) and $OUT/ab-summary.txt
# (tools/gpu_ab_summary.py: per row the median over rounds, its range, x floor, tree / base). Keep ROUNDS <= 3: the
# device returns at most 8 files. A 2-round run of 2 layers x 2 TPs at one batch took ~400 s on an H100.
set -uo pipefail
case "${1:-}" in
  prepare)
    rev=${2:?usage: tools/gpu-ab.sh prepare <base rev>}
    cd "$(git rev-parse --show-toplevel)"
    git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "gpu-ab: $rev is not a commit" >&2; exit 1; }
    rm -rf .ab/base && mkdir -p .ab/base
    git archive "$rev" kimi_k3_path benchmarks gatekeeper | tar x -C .ab/base
    echo "$(git rev-parse "$rev")" > .ab/base/REV
    echo "gpu-ab: .ab/base holds $(cat .ab/base/REV); on the device: carry [\".cute\", \".whl\", \".ab\"], bash tools/gpu-ab.sh run"
    ;;
  run)
    : "${OUT:?}"
    [ -f .ab/base/REV ] || { echo "gpu-ab: no .ab/base (run tools/gpu-ab.sh prepare <rev> first, carry .ab)" >&2; exit 1; }
    . tools/gpu-env.sh
    root=$PWD
    tree_path=$PYTHONPATH
    base_path="$root/.ab/base:${PYTHONPATH#"$root":}"
    echo "gpu-ab: base $(cat .ab/base/REV) against the working tree" | tee "$OUT/ab.log"
    rc=0
    for round in $(seq 1 "${ROUNDS:-2}"); do
      for variant in tree base; do
        if [ "$variant" = base ]; then dir=$root/.ab/base path=$base_path commit=0000000
        else dir=$root path=$tree_path commit=1111111; fi
        (cd "$dir" && PYTHONPATH=$path python3 -m benchmarks.kimi_k3.bench --layer "${LAYERS:-kda_moe,mla_moe}" \
          --tp "${TPS:-8,16}" --batch "${BATCH:-1}" --context "${CONTEXT:-4096}" --candidate kernels \
          --replays "${REPLAYS:-200}" --commit "$commit" --out "$OUT/ab-$variant-$round.json") >>"$OUT/ab.log" 2>&1
        status=$?
        echo "gpu-ab: round $round $variant rc=$status" | tee -a "$OUT/ab.log"
        [ "$status" = 0 ] || rc=1
      done
    done
    python3 tools/gpu_ab_summary.py "$OUT"/ab-*.json | tee "$OUT/ab-summary.txt" || rc=1
    exit $rc
    ;;
  *)
    echo "usage: tools/gpu-ab.sh prepare <base rev> | run" >&2
    exit 2
    ;;
esac
