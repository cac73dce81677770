#!/usr/bin/env bash
# A/B timing of two header trees on the same shapes, back to back per shape (one device call).
# Usage: AB_OLD=path/to/include [AB_CONFIGS="bm,bn,cm;..."] scripts/ab_headers.sh MxNxK ...
# "old" times with DEEPGEMM_INCLUDE_DIR=$AB_OLD, "new" with the package's own headers; each cell is
# scripts/ablate.py --time (CUDA graph, L2 flushed, median of 30). Empty config = the cost model's pick.
set -uo pipefail
export PYTHONPATH=$PWD DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-/tmp/deepgemm-cache}
IFS=';' read -ra configs <<<"${AB_CONFIGS:-}"
[ ${#configs[@]} -eq 0 ] && configs=("")
echo "| shape | config | old µs | new µs | new/old |"
echo "|---|---|---|---|---|"
for shape in "$@"; do
  for cfg in "${configs[@]}"; do
    old=$(DEEPGEMM_INCLUDE_DIR=$AB_OLD ABLATE_CONFIG=$cfg python3 scripts/ablate.py --time "$shape" 2>&1 | tail -1)
    new=$(ABLATE_CONFIG=$cfg python3 scripts/ablate.py --time "$shape" 2>&1 | tail -1)
    o=${old%% *}; n=${new%% *}
    ratio=$(python3 -c "print(f'{float(\"$n\")/float(\"$o\"):.3f}')" 2>/dev/null || echo "?")
    echo "| $shape | ${new#* } | $o | $n | $ratio |"
  done
done
