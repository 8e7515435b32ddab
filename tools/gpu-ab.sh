#!/usr/bin/env bash
# A/B of the benches between commits and the working tree, in one device run: each variant in processes of its own,
# the variants alternating round after round, so that their ratios are measured on one machine in one run (medians
# from different runs or cards are not comparable). Two halves:
#   here, on the CPU machine:  tools/gpu-ab.sh prepare <rev> [<name>]   # .ab/<name>/ (default base): <rev>'s
#                                                                       # kimi_k3_path, benchmarks and gatekeeper
#                                                                       # (git archive); .ab/ is git-ignored
#                              tools/gpu-ab.sh clear                    # forget every prepared variant
#   on the device, carry [".cute", ".whl", ".ab"]:
#     [BENCH=layer|moe|mla|attn_res] [LAYERS=kda_moe,mla_moe] [TPS=8,16] [BATCH=1] [CONTEXT=4096] [ROUNDS=2]
#     [REPLAYS=200] [BREAKDOWN=graph|eager]
#     bash tools/gpu-ab.sh run
# Several variants at once: prepare each commit under a name of its own (one of them `base`, the reference of the
# ratios); the run takes the working tree (`tree`) and every prepared variant in turn, each round.
# BENCH=layer (default): benchmarks/kimi_k3/bench.py --candidate kernels, the layers of LAYERS at CONTEXT.
# BENCH=moe: benchmarks/kimi_k3/bench_moe.py, the MoE block (LAYERS and CONTEXT unused), each launch alone at the
# batches too (--steps-at BATCH; the summary's second table; their ab-<variant>-<round>.launches.json files are
# removed once summarized, to keep within the 8 files that come back).
# BENCH=mla: benchmarks/kimi_k3/bench_mla.py, the MLA split-KV attention alone at CONTEXT (a comma list here too;
# LAYERS unused), against a pure read of the cache in the same process.
# BENCH=attn_res: benchmarks/kimi_k3/bench_attn_res.py, one AttnRes site alone at BATCH (cluster form against one CTA
# per token; TPS, LAYERS and CONTEXT unused); each variant runs its own copy of the bench, so from d210070 on.
# BREAKDOWN (BENCH=layer only): bench.py --breakdown, each candidate step's launches with their share of it (graph:
# one profiled replay of the step's CUDA graph, launches overlapping as when timed), gathered per variant and round
# into $OUT/ab-breakdown.txt: which launch a change moved, where the step's time alone cannot say.
# The run writes $OUT/ab-<variant>-<round>.json (PerfEvidence, commit 0000000: probes, never evidence of record),
# $OUT/ab.log (every bench's output) and $OUT/ab-summary.txt (tools/gpu_ab_summary.py: per row and variant the
# median over rounds, its range, x floor, x base). At most 8 files come back from the device: keep
# variants x ROUNDS <= 6 (<= 5 with BREAKDOWN). A 2-round run of 2 variants, 2 layers x 2 TPs at one batch took
# ~400 s on an H100; the MoE block at 3 batches ~70 s per variant and round.
set -uo pipefail
NAME_RE='^[a-z0-9_]+$'
prepared() { (cd .ab 2>/dev/null && ls -d */REV 2>/dev/null | sed 's|/REV||' | tr '\n' ' '); }  # the variants in .ab/
case "${1:-}" in
  prepare)
    rev=${2:?usage: tools/gpu-ab.sh prepare <rev> [<name>]}
    name=${3:-base}
    [[ "$name" =~ $NAME_RE && "$name" != tree ]] || { echo "gpu-ab: variant name '$name': [a-z0-9_]+, not 'tree'" >&2; exit 2; }
    cd "$(git rev-parse --show-toplevel)"
    git rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "gpu-ab: $rev is not a commit" >&2; exit 1; }
    rm -rf ".ab/$name" && mkdir -p ".ab/$name"
    # The evidence stays behind: the benches do not read it, and the device takes 64 MiB with .cute's 54.
    git archive "$rev" kimi_k3_path benchmarks gatekeeper | tar x -C ".ab/$name" --exclude kimi_k3_path/evidence
    git rev-parse "$rev" > ".ab/$name/REV"
    echo "gpu-ab: .ab/$name holds $(cat ".ab/$name/REV"); variants prepared: $(prepared)"
    echo "gpu-ab: on the device: carry [\".cute\", \".whl\", \".ab\"], bash tools/gpu-ab.sh run"
    ;;
  clear)
    cd "$(git rev-parse --show-toplevel)"
    for rev in .ab/*/REV; do [ -f "$rev" ] && rm -rf "$(dirname "$rev")"; done
    echo "gpu-ab: no variants prepared"
    ;;
  run)
    : "${OUT:?}"
    [ -f .ab/base/REV ] || { echo "gpu-ab: no .ab/base (tools/gpu-ab.sh prepare <rev> first, carry .ab)" >&2; exit 1; }
    case "${BREAKDOWN:-}" in
      "") ;;
      graph|eager) [ "${BENCH:-layer}" = layer ] || { echo "gpu-ab: BREAKDOWN needs BENCH=layer" >&2; exit 2; } ;;
      *) echo "gpu-ab: BREAKDOWN=${BREAKDOWN}: graph or eager" >&2; exit 2 ;;
    esac
    . tools/gpu-env.sh
    root=$PWD
    tree_path=$PYTHONPATH
    variants="tree $(prepared)"
    : > "$OUT/ab.log"
    for variant in $variants; do
      if [ "$variant" = tree ]; then what="the working tree"; else what=$(cat ".ab/$variant/REV"); fi
      echo "gpu-ab: $variant = $what" | tee -a "$OUT/ab.log"
    done
    rc=0
    for round in $(seq 1 "${ROUNDS:-2}"); do
      for variant in $variants; do
        if [ "$variant" = tree ]; then dir=$root path=$tree_path
        else dir=$root/.ab/$variant path="$root/.ab/$variant:${PYTHONPATH#"$root":}"; fi
        out="$OUT/ab-$variant-$round.json"
        if [ "${BENCH:-layer}" = attn_res ]; then
          cmd=(python3 -m benchmarks.kimi_k3.bench_attn_res --batch "${BATCH:-1}" --replays "${REPLAYS:-50}"
               --commit 0000000 --out "$out")
        elif [ "${BENCH:-layer}" = mla ]; then
          cmd=(python3 -m benchmarks.kimi_k3.bench_mla --tp "${TPS:-8,16}" --batch "${BATCH:-1}"
               --context "${CONTEXT:-4096}" --replays "${REPLAYS:-100}" --commit 0000000 --out "$out")
        elif [ "${BENCH:-layer}" = moe ]; then
          cmd=(python3 -m benchmarks.kimi_k3.bench_moe --tp "${TPS:-8,16}" --batch "${BATCH:-1}"
               --steps-at "${BATCH:-1}" --replays "${REPLAYS:-50}" --commit 0000000 --out "$out"
               --kernels-out "${out%.json}.launches.json")
        else
          cmd=(python3 -m benchmarks.kimi_k3.bench --layer "${LAYERS:-kda_moe,mla_moe}" --tp "${TPS:-8,16}"
               --batch "${BATCH:-1}" --context "${CONTEXT:-4096}" --candidate kernels --replays "${REPLAYS:-200}"
               --commit 0000000 --out "$out" ${BREAKDOWN:+--breakdown "$BREAKDOWN"})
        fi
        echo "gpu-ab: round $round $variant: ${cmd[*]}" >>"$OUT/ab.log"
        (cd "$dir" && PYTHONPATH=$path "${cmd[@]}") >>"$OUT/ab.log" 2>&1
        status=$?
        echo "gpu-ab: round $round $variant rc=$status" | tee -a "$OUT/ab.log"
        [ "$status" = 0 ] || rc=1
      done
    done
    python3 tools/gpu_ab_summary.py "$OUT"/ab-*.json | tee "$OUT/ab-summary.txt" || rc=1
    if [ -n "${BREAKDOWN:-}" ]; then  # the candidate's tables, each under the variant and round that printed it
      awk '/^gpu-ab: round [0-9]+ [a-z0-9_]+: / { round = $3; variant = $4; sub(/:$/, "", variant); next }
           /^breakdown .* candidate: / { print "== " variant ", round " round; print; keep = 1; next }
           keep && /^    / { print; next }
           { keep = 0 }' "$OUT/ab.log" > "$OUT/ab-breakdown.txt"
    fi
    rm -f "$OUT"/ab-*.launches.json
    exit $rc
    ;;
  *)
    echo "usage: tools/gpu-ab.sh prepare <rev> [<name>] | clear | run" >&2
    exit 2
    ;;
esac
