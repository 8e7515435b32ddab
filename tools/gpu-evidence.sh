#!/usr/bin/env bash
# One device run that regenerates the GPU evidence the policy reads (carry [".cute", ".whl"]):
#   $OUT/gpu/junit.xml, $OUT/gpu/.coverage      GPU tests under coverage.py with per-test contexts: the
#   $OUT/gpu/nodeids.txt                        raw data file (a few MB; its `coverage json --show-contexts`
#                                               report repeats every test id on every line, 16+ MB) and the
#                                               collected node ids. Afterwards, on the CPU machine, in a
#                                               checkout of $SHA: tools/gpu-evidence-import.sh <run folder>,
#                                               which does the following (docs/evidence.md, "GPU reports"):
#                                                 gatekeeper gpu-report --junit gpu/junit.xml --coverage gpu/.coverage \
#                                                   --nodeids gpu/nodeids.txt --commit $SHA --repo . \
#                                                   --out kimi_k3_path/evidence/gpu/gpu-evidence.json
#                                               (-> the policy's gpu_report_globs; commit only that JSON)
#   $OUT/perf/h200.json                         per-layer bench, CuTe DSL kernels vs the stock-like path
#                                               (-> kimi_k3_path/evidence/perf/, the policy's evidence_globs)
#   $OUT/perf/h200-context<N>-tp<T>.json        the MLA+MoE layer at each longer context N of the support
#                                               matrix's perf_contexts (CONTEXTS, default 32768; CONTEXTS= skips
#                                               them), one file per TP: ~115 s at 100 replays for 32768
#   $OUT/kernels/*.json                         with KERNEL_BENCH=1: the MoE block and each kernel alone at M=1
#                                               (KERNEL_BATCHES=1,2,8,64: at those batches);
#                                               with MLA_BENCH=1: the MLA split-KV attention alone (bench_mla);
#                                               with DENSE_BENCH=1: the attentions' GEMVs alone vs cuBLAS (bench_dense);
#                                               with ATTN_RES_BENCH=1: an AttnRes site alone (bench_attn_res)
#   $OUT/tests.log, $OUT/bench.log              everything printed, bench.log ending with a `gpu state:` line
#                                               (clocks, temperature, power, clock-event reasons). At most 8
#                                               files come back from a run: these are 8 with KERNEL_BENCH=1;
#                                               with more under $OUT, a caller's log say, all go into
#                                               $OUT/gpu-evidence.tgz instead.
# Usage on the device: SHA=<commit measured> [BENCH=0 | TESTS=0] [KERNEL_OPS=moe,kda,...] bash tools/gpu-evidence.sh
# (KERNEL_OPS: the bench's --kernel-ops, the op families its candidate runs on the kernels; default all)
# Give SHA literally, as `git rev-parse HEAD` prints it here: on the device, git's HEAD in the copied tree was
# the session's first commit, not the checkout's (it stamped run-86208e9 with 4836d86; corrected by hand).
# (BENCH=0: the tests only, when the perf matrix of an ancestor within the policy's commit window still holds.
# TESTS=0: the benches only. The whole run took 521 s of a call's 600 at 6918563: split it into a BENCH=0 call and a
# TESTS=0 call at the same SHA, then tools/gpu-evidence-import.sh <the first folder> <the second>.)
# Assumes of the machine: one NVIDIA H200 (sm_90) with nvidia-smi, and what tools/gpu-env.sh assumes.
set -uo pipefail
: "${SHA:?set SHA to the commit being measured}" "${OUT:?}"
. tools/gpu-env.sh
mkdir -p "$OUT/gpu" "$OUT/perf" "$OUT/kernels"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv | tee "$OUT/tests.log"
# The GPU's state throughout (every 500 ms), summarized into bench.log at the end: a slower run can then be told
# from a throttled or hot GPU (a slow matrix once needed a separate call for that).
state=$(mktemp)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active \
  --format=csv,noheader,nounits -lms 500 >"$state" 2>&1 &
state_pid=$!

# Only the gpu-marked tests: CI runs the rest, and the GPU image's Triton interpreter differs from CI's.
tests_rc=0
if [ "${TESTS:-1}" = 1 ]; then
  gpu_tests=$(grep -l "pytest.mark.gpu" -r tests/kimi_k3_path tests/benchmarks | sort)
  PYTHONPATH="$PYTHONPATH:gatekeeper/collect/plugin" GATEKEEPER_NODEIDS="$OUT/gpu/nodeids.txt" \
    python3 -m coverage run --source=kimi_k3_path --data-file="$OUT/gpu/.coverage" \
    -m pytest $gpu_tests -m gpu -q -p no:cacheprovider -p gatekeeper_pytest_contexts \
    --junitxml="$OUT/gpu/junit.xml" 2>&1 | tee -a "$OUT/tests.log"
  tests_rc=${PIPESTATUS[0]}
  ls -l "$OUT/gpu" | tee -a "$OUT/tests.log"
fi

bench_rc=0
if [ "${BENCH:-1}" = 1 ]; then
  python3 -m benchmarks.kimi_k3.bench --layer kda_moe,mla_moe,moe,step --tp 8,16 --batch 1,2,4,8,16,32,64 \
    --candidate kernels ${KERNEL_OPS:+--kernel-ops "$KERNEL_OPS"} --replays "${REPLAYS:-200}" --commit "$SHA" \
    --out "$OUT/perf/h200.json" 2>&1 | tee -a "$OUT/bench.log"
  bench_rc=${PIPESTATUS[0]}
  # The longer contexts: only the MLA layer reads the KV cache (the policy's axis_exemptions ask the others at one
  # context). One process per TP, so that a run cut short still returns the TPs that finished.
  for context in ${CONTEXTS:-32768}; do
    for tp in 8 16; do
      python3 -m benchmarks.kimi_k3.bench --layer mla_moe --tp "$tp" --batch 1,2,4,8,16,32,64 --context "$context" \
        --candidate kernels ${KERNEL_OPS:+--kernel-ops "$KERNEL_OPS"} --replays "${REPLAYS:-200}" --commit "$SHA" \
        --out "$OUT/perf/h200-context$context-tp$tp.json" 2>&1 | tee -a "$OUT/bench.log"
      [ "${PIPESTATUS[0]}" = 0 ] || bench_rc=1
    done
  done
fi
# KERNEL_BATCHES (default 1) picks the batches, e.g. 1,2,8,64 for the block's per-launch times above one token.
[ "${KERNEL_BENCH:-0}" = 1 ] && python3 -m benchmarks.kimi_k3.bench_moe --tp 8,16 --batch "${KERNEL_BATCHES:-1}" \
  --steps-at "${KERNEL_BATCHES:-1}" --replays 50 --commit "$SHA" --out "$OUT/kernels/moe_block.json" \
  --kernels-out "$OUT/kernels/moe_kernels.json" 2>&1 | tee -a "$OUT/bench.log"
# MLA_BENCH=1: the MLA split-KV attention alone at the contexts of issue 36 (its rows stay outside the matrix of
# record: quote them in the commit message or the issue note). MLA_TP picks the TPs (default both).
[ "${MLA_BENCH:-0}" = 1 ] && python3 -m benchmarks.kimi_k3.bench_mla --tp "${MLA_TP:-8,16}" --batch 1,8,64 \
  --context 4096,32768 --replays "${MLA_REPLAYS:-50}" --commit "$SHA" --out "$OUT/kernels/mla_attention.json" 2>&1 \
  | tee -a "$OUT/bench.log"
# DENSE_BENCH=1: the KDA and MLA attentions' GEMVs alone, dense.py against cuBLAS and a pure read (issue 35's 1.15x).
[ "${DENSE_BENCH:-0}" = 1 ] && python3 -m benchmarks.kimi_k3.bench_dense --tp 8,16 --batch 1,2,8,64 --replays 50 \
  --commit "$SHA" --out "$OUT/kernels/dense.json" 2>&1 | tee -a "$OUT/bench.log"
# ATTN_RES_BENCH=1: one AttnRes site alone, its cluster form against one CTA per token (bench_attn_res).
[ "${ATTN_RES_BENCH:-0}" = 1 ] && python3 -m benchmarks.kimi_k3.bench_attn_res --batch 1,2,8,16,32,64 --replays 50 \
  --commit "$SHA" --out "$OUT/kernels/attn_res.json" 2>&1 | tee -a "$OUT/bench.log"
kill "$state_pid" 2>/dev/null
python3 tools/gpu_state_summary.py "$state" | tee -a "$OUT/bench.log"
rm -f "$state"
echo "gpu tests rc=$tests_rc bench rc=$bench_rc"
# The device returns at most 8 files from $OUT and drops the rest without failing the run (it dropped perf/h200.json
# once, when the caller's own log under $OUT made 9): past 8, pack them all into one archive that does come back.
files=$(cd "$OUT" && find . -type f | sort)
count=$(printf '%s\n' "$files" | grep -c .)
if [ "$count" -gt 8 ]; then
  echo "gpu-evidence: $count files under \$OUT, more than the 8 the device returns: packed into gpu-evidence.tgz" >&2
  (cd "$OUT" && tar czf gpu-evidence.tgz $files && rm -f $files)
fi
[ "$tests_rc" = 0 ] && [ "$bench_rc" = 0 ]
