#!/usr/bin/env bash
# Nsight Compute over one layer's launches in one device run (carry [".cute", ".whl"]): where a latency-bound launch's
# time goes, which the graph breakdown (bench.py --breakdown graph) cannot say.
#   [LAYER=kda_moe] [TP=8] [BATCH=1] [CONTEXT=4096] [KERNELS=<regex of kernel names>] [COUNT=6] [STALLS=1]
#   bash tools/gpu-profile.sh
# runs benchmarks/kimi_k3/bench.py (the candidate only, 3 replays, one process) under
#   ncu --clock-control none (METHOD.md: leave the clocks alone) -k regex:$KERNELS --launch-count $COUNT
# with the sections that tell a latency-bound launch from a bandwidth-bound one (speed of light, launch, occupancy,
# scheduler, warp state) and, with STALLS=1, the per-warp stall reasons (smsp__average_warps_issue_stalled_*), and
# writes $OUT/ncu.txt (ncu's report) and $OUT/ncu-summary.txt (tools/ncu_summary.py: a row per launch).
# KERNELS defaults to every CuTe DSL kernel of the repository (their names hold kimi_k3_path); the stock-like Triton
# kernels are named _<op>_kernel. ncu serializes launches and flushes caches between passes: its durations are each
# launch alone from cold L2, not its share of a graph replay.
set -uo pipefail
: "${OUT:?}"
. tools/gpu-env.sh
sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats
          --section WarpStateStats)
if [ "${STALLS:-1}" = 1 ]; then
  sections+=(--metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio')
fi
ncu --clock-control none "${sections[@]}" -k "regex:${KERNELS:-kimi_k3_path}" --launch-count "${COUNT:-6}" \
  python3 -m benchmarks.kimi_k3.bench --layer "${LAYER:-kda_moe}" --tp "${TP:-8}" --batch "${BATCH:-1}" \
  --context "${CONTEXT:-4096}" --candidate kernels --replays 3 --processes one --commit 0000000 \
  > "$OUT/ncu.txt" 2>&1
rc=$?
echo "gpu-profile: ncu rc=$rc ($(grep -c '^==PROF== Profiling' "$OUT/ncu.txt") launches profiled)"
python3 tools/ncu_summary.py "$OUT/ncu.txt" | tee "$OUT/ncu-summary.txt" || rc=1
exit $rc
