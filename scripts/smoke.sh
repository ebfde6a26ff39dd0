#!/usr/bin/env bash
# End-to-end smoke test of an installed charlm, for CI pipelines to copy:
# download (from a mirror or file:// URL), train the tiny config, check eval loss, sample.
#
#   scripts/smoke.sh [URL] [MAX_LOSS]        URL defaults to $CHARLM_DATA_URL, then the canonical URL
#
# Exits non-zero, with charlm's one-line message, at the first step that fails.
set -euo pipefail

url="${1:-${CHARLM_DATA_URL:-}}"
max_loss="${2:-2.7}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== download"
charlm download ${url:+--url "$url"} --dest "$work/input.txt"

echo "== train (configs/tiny.yaml)"
charlm train --config tiny --data "$work/input.txt" --out-dir "$work/run" --quiet --json >"$work/summary.json"
cat "$work/summary.json"

echo "== eval (full validation pass must be <= $max_loss nats/char)"
charlm eval "$work/run/best.pt" --data "$work/input.txt" --json | tee "$work/eval.json"
python3 - "$work/eval.json" "$max_loss" <<'PY'
import json, sys
loss = json.load(open(sys.argv[1]))["loss"]
limit = float(sys.argv[2])
if loss > limit:
    sys.exit(f"smoke: eval loss {loss:.4f} is above {limit}")
print(f"smoke: eval loss {loss:.4f} <= {limit}")
PY

echo "== sample"
charlm sample "$work/run/best.pt" --prompt "JULIET:" --max-new-tokens 100 --seed 1 --no-stream
echo "== smoke test passed"
