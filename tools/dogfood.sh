#!/usr/bin/env bash
# Dogfood: run `gatekeeper collect` and `gatekeeper check` on this repository's own reference contribution
# (kimi_k3_path/) with its own policy and the GPU evidence committed under kimi_k3_path/evidence/.
#
#   tools/dogfood.sh [BASE]
#
# BASE defaults to the parent of the first commit that added kimi_k3_path/, so the whole contribution is
# judged as one pull request. The change is treated as agent-assisted, so every rule of the policy applies,
# and an undecided rule fails (--strict). Reports go to $DOGFOOD_OUT (default: a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."

POLICY=policies/kimi-k3-latency-specialized.yaml
GATEKEEPER=${GATEKEEPER:-.venv/bin/gatekeeper}
command -v "$GATEKEEPER" >/dev/null || GATEKEEPER=gatekeeper
OUT=${DOGFOOD_OUT:-$(mktemp -d -t gatekeeper-dogfood.XXXXXX)}
mkdir -p "$OUT"

# A shallow clone (CI's default) has neither the base commit nor the ancestry the perf commit window needs.
if [ "$(git rev-parse --is-shallow-repository)" = true ]; then
  git fetch --quiet --unshallow --no-tags origin || echo "dogfood: warning: could not unshallow; pass BASE explicitly" >&2
fi

base=${1:-}
if [ -z "$base" ]; then
  first=$(git log --diff-filter=A --format=%H -- kimi_k3_path | tail -n 1)  # oldest; tail reads all (no SIGPIPE)
  if [ -z "$first" ]; then
    echo "dogfood: no commit adds kimi_k3_path/; nothing to check" >&2
    exit 2
  fi
  if ! base=$(git rev-parse --verify --quiet "$first^"); then
    echo "dogfood: $first has no parent in this clone; pass BASE explicitly" >&2
    exit 2
  fi
fi
echo "dogfood: checking $(git rev-parse --short "$base")..$(git rev-parse --short HEAD) with $POLICY; reports in $OUT" >&2

"$GATEKEEPER" collect --policy "$POLICY" --base "$base" --out "$OUT/evidence.json"
"$GATEKEEPER" check --policy "$POLICY" --base "$base" --evidence "$OUT/evidence.json" --agent-assisted \
  --format markdown --output "$OUT/report.md" --strict || true
exec "$GATEKEEPER" check --policy "$POLICY" --base "$base" --evidence "$OUT/evidence.json" --agent-assisted --strict
