#!/usr/bin/env bash
# Bring one device run of tools/gpu-evidence.sh into the repository, here on the CPU machine, in a clean checkout of
# the commit it measured (the run's SHA must be this checkout's HEAD):
#   tools/gpu-evidence-import.sh <folder the device run's files came back to> [<the benches' folder>]
# The second folder is for a run split into a BENCH=0 and a TESTS=0 call at one SHA (tools/gpu-evidence.sh): the
# tests come from the first folder, the bench JSON, kernel JSON and bench.log from the second.
# Writes kimi_k3_path/evidence/gpu/gpu-evidence.json (gatekeeper gpu-report) and kimi_k3_path/evidence/perf/h200.json
# (when the run benched): the only results the repository keeps, what the policy reads. The run's logs and kernel
# JSON stay in the run folders, outside the repository; quote their numbers in the commit message or the issue note.
# Then update the "Of record" section of kimi_k3_path/evidence/README.md and commit. Refuses a run whose bench JSON names another commit (a mistyped SHA on
# the device stamped 361ba39's matrix with a commit that does not exist; the dogfood caught it only later).
set -euo pipefail
run=${1:?usage: tools/gpu-evidence-import.sh <device run folder> [<bench run folder>]}
bench=${2:-$run}
cd "$(git rev-parse --show-toplevel)"
sha=$(git rev-parse HEAD)
if ! git diff --quiet HEAD -- kimi_k3_path tests; then
  echo "gpu-evidence-import: kimi_k3_path/ or tests/ differ from HEAD $sha: the report would not describe them" >&2
  exit 1
fi
for f in gpu/junit.xml gpu/.coverage gpu/nodeids.txt tests.log; do
  [ -f "$run/$f" ] || { echo "gpu-evidence-import: $run/$f is missing (did the run finish? a run of more than 8 files comes back as gpu-evidence.tgz: unpack it there first)" >&2; exit 1; }
done
for f in "$bench"/perf/*.json "$bench"/kernels/*.json; do
  [ -f "$f" ] || continue
  measured=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(isinstance(d, dict) and d.get("commit") or "")' "$f")
  if [ -n "$measured" ] && [ "$measured" != "$sha" ]; then
    echo "gpu-evidence-import: $f was measured at $measured, not at HEAD $sha" >&2
    exit 1
  fi
done
# The matrix of record is the H200's: its floors are the H200's measured copy rate (runtime.COPY_BANDWIDTH). A run the
# device placed on another card (it lends H100s under the same kind) stays a probe: quote its ratios, not its rows.
for f in "$bench"/perf/h200*.json; do
  [ -f "$f" ] || continue
  gpu=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("hardware", {}).get("gpu", ""))' "$f")
  case "$gpu" in
    *H200*) ;;
    *) echo "gpu-evidence-import: $f was measured on '$gpu', not an H200: not imported as evidence of record" >&2
       exit 1 ;;
  esac
done
gatekeeper=${GATEKEEPER:-.venv/bin/gatekeeper}
mkdir -p kimi_k3_path/evidence/gpu kimi_k3_path/evidence/perf
"$gatekeeper" gpu-report --junit "$run/gpu/junit.xml" --coverage "$run/gpu/.coverage" \
  --nodeids "$run/gpu/nodeids.txt" --commit "$sha" --repo . --out kimi_k3_path/evidence/gpu/gpu-evidence.json
perf=$(cd "$bench" && ls perf/h200.json perf/h200-context*.json 2>/dev/null || true)
for f in $perf; do
  cp "$bench/$f" "kimi_k3_path/evidence/$f"
done
chmod -R u+w kimi_k3_path/evidence
echo "imported the run at ${sha:0:7}: kimi_k3_path/evidence/gpu/gpu-evidence.json" \
  "${perf:+and $(echo $perf)};" "logs and kernel JSON stay in $run ${2:+and $bench}"
