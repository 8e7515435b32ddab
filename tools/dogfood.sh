#!/usr/bin/env bash
# Dogfood: `gatekeeper collect` + `gatekeeper check` on this repository's own reference contribution
# (kimi_k3_path/ and its tests) with its own policy and the GPU evidence committed in the repository.
#
#   [DOGFOOD_REQUIRE=rule,rule] tools/dogfood.sh [BASE]
#
# The contribution shares its history with the gatekeeper itself, so `BASE..HEAD` would also contain every
# gatekeeper commit. Instead, in a throwaway clone, two commits are made on top of HEAD:
#   S  = HEAD with the contribution's paths (the policy's owned paths) as they were at BASE, or absent when
#        no BASE is given (then the whole contribution is judged),
#   H' = HEAD's tree again, on top of S,
# so `S...H'` is exactly the contribution, H' holds exactly HEAD's files, and HEAD's history stays behind
# them for the perf commit window. Nothing in this checkout (index, work tree, refs) is touched.
#
# The change is treated as agent-assisted, so every rule of the policy applies, and an undecided rule fails
# (--strict). Reports go to $DOGFOOD_OUT (default: a temporary directory): report.md, verdict.json and the details
# page, report.html.
set -euo pipefail
cd "$(dirname "$0")/.."

POLICY=policies/kimi-k3-latency-specialized.yaml
GATEKEEPER=${GATEKEEPER:-$PWD/.venv/bin/gatekeeper}
PYTHON=${PYTHON:-$PWD/.venv/bin/python}
command -v "$GATEKEEPER" >/dev/null || GATEKEEPER=gatekeeper
command -v "$PYTHON" >/dev/null || PYTHON=python3
OUT=${DOGFOOD_OUT:-$(mktemp -d -t gatekeeper-dogfood.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
base=${1:-}

# A shallow clone (CI's default) lacks the ancestry the perf commit window needs, and maybe BASE.
if [ "$(git rev-parse --is-shallow-repository)" = true ]; then
  git fetch --quiet --unshallow --no-tags origin || echo "dogfood: warning: could not unshallow" >&2
fi
head=$(git rev-parse HEAD)
if [ -n "$base" ]; then base=$(git rev-parse --verify "$base^{commit}"); fi

# The contribution's paths, as git pathspecs, from the policy itself.
mapfile -t pathspecs < <("$PYTHON" -c '
import sys
from gatekeeper.policy import load_policy
policy = load_policy(sys.argv[1]).policy
for pattern in (*policy.owned_paths, *(t.path for t in policy.touchpoints)):
    print(":(glob)" + pattern)
' "$POLICY")

work=$(mktemp -d -t gatekeeper-dogfood-repo.XXXXXX)
trap 'rm -rf "$work"' EXIT
git clone --quiet --shared --no-checkout . "$work/repo"
cd "$work/repo"
export GIT_INDEX_FILE="$work/index"
git read-tree "$head"
git rm -r --cached --quiet --ignore-unmatch -- "${pathspecs[@]}"
if [ -n "$base" ]; then git ls-tree -r "$base" -- "${pathspecs[@]}" | git update-index --index-info; fi
ident=(-c user.name=gatekeeper-dogfood -c user.email=dogfood@gatekeeper.invalid)
start=$(git "${ident[@]}" commit-tree "$(git write-tree)" -p "$head" -m "dogfood: HEAD without the contribution")
contribution=$(git "${ident[@]}" commit-tree "$head^{tree}" -p "$start" -m "dogfood: the contribution")
unset GIT_INDEX_FILE
git checkout --quiet --detach "$contribution"
echo "dogfood: judging the contribution at $(git rev-parse --short "$head") (${base:+since $(git rev-parse --short "$base"), }paths: ${pathspecs[*]}) with $POLICY; reports in $OUT" >&2

"$GATEKEEPER" collect --policy "$POLICY" --base "$start" --out "$OUT/evidence.json"
"$GATEKEEPER" check --policy "$POLICY" --base "$start" --evidence "$OUT/evidence.json" --agent-assisted \
  --format markdown --output "$OUT/report.md" --strict || true
"$GATEKEEPER" check --policy "$POLICY" --base "$start" --evidence "$OUT/evidence.json" --agent-assisted \
  --format json --output "$OUT/verdict.json" --strict || true
"$GATEKEEPER" check --policy "$POLICY" --base "$start" --evidence "$OUT/evidence.json" --agent-assisted \
  --format html --output "$OUT/report.html" --strict || true
if [ -z "${DOGFOOD_REQUIRE:-}" ]; then
  "$GATEKEEPER" check --policy "$POLICY" --base "$start" --evidence "$OUT/evidence.json" --agent-assisted --strict
  exit
fi
# DOGFOOD_REQUIRE=rule,rule: print the whole verdict, but fail only when one of those rules does not pass (for CI
# while the others wait on evidence that only a GPU session can produce; the report names them).
"$GATEKEEPER" check --policy "$POLICY" --base "$start" --evidence "$OUT/evidence.json" --agent-assisted || true
"$PYTHON" - "$OUT/verdict.json" "$DOGFOOD_REQUIRE" <<'PY'
import json
import sys

verdict = json.load(open(sys.argv[1], encoding="utf-8"))
status = {check["id"]: check["status"] for check in verdict["checks"]}
required = [rule for rule in sys.argv[2].split(",") if rule]
unknown = [rule for rule in required if rule not in status]
failing = [f"{rule}={status[rule]}" for rule in required if rule in status and status[rule] != "pass"]
waived = [f"{rule}={state}" for rule, state in status.items() if rule not in required and state != "pass"]
if unknown:
    sys.exit(f"dogfood: DOGFOOD_REQUIRE names unknown rules: {', '.join(unknown)}")
if waived:
    print(f"dogfood: NOT required here, and not passing: {', '.join(waived)}", file=sys.stderr)
if failing:
    sys.exit(f"dogfood: FAIL: required rules do not pass: {', '.join(failing)}")
print(f"dogfood: required rules pass: {', '.join(required)}", file=sys.stderr)
PY
