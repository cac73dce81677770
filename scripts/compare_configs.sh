#!/usr/bin/env bash
# Time the cost model's pick against explicit tiles, back to back per shape (one device call).
# Usage: CONFIGS="bm,bn,cm[,stages];..." scripts/compare_configs.sh MxNxK ...   (scripts/ablate.py --time cells:
# CUDA graph, L2 flushed, median of 30; µs and TFLOPS)
set -uo pipefail
export PYTHONPATH=$PWD DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-/tmp/deepgemm-cache}
IFS=';' read -ra configs <<<"${CONFIGS:-}"
echo "| shape | config | µs | TFLOPS |"
echo "|---|---|---|---|"
for shape in "$@"; do
  read -r m n k <<<"$(echo "$shape" | tr x ' ')"
  for cfg in "" "${configs[@]}"; do
    line=$(ABLATE_CONFIG=$cfg python3 scripts/ablate.py --time "$shape" 2>&1 | tail -1)
    us=${line%% *}
    tf=$(python3 -c "print(f'{2*$m*$n*$k/float(\"$us\")/1e6:.0f}')" 2>/dev/null || echo "?")
    echo "| $shape | ${line#* } | $us | $tf |"
  done
done
