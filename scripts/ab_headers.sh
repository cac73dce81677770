#!/usr/bin/env bash
# A/B timing of two kernel builds on the same shapes, alternating old/new twice per shape (one device call).
# Usage: AB_OLD=path/to/include [AB_CONFIGS="bm,bn,cm;..."] scripts/ab_headers.sh MxNxK ...
#        AB_OLD_TREE=path/to/old/checkout scripts/ab_headers.sh MxNxK ...   (when the host code changed too:
#        "old" then runs that tree's package and scripts, e.g. `git archive HEAD | tar -x -C .ab/old`)
#        AB_ENV_A="DEEPGEMM_BALANCED_GRID=0" AB_ENV_B="DEEPGEMM_BALANCED_GRID=1" scripts/ab_headers.sh MxNxK ...
#        (one tree, two environment settings: "old" runs with AB_ENV_A, "new" with AB_ENV_B)
# "old" times with DEEPGEMM_INCLUDE_DIR=$AB_OLD (or the old tree), "new" with this tree; each cell is
# scripts/ablate.py --time (CUDA graph, L2 flushed, median of 30), run old, new, old, new so a drift in
# the power state shows up as disagreement between the two runs of one side. Empty config = the model's pick.
set -uo pipefail
export DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-/tmp/deepgemm-cache}
IFS=';' read -ra configs <<<"${AB_CONFIGS:-}"
[ ${#configs[@]} -eq 0 ] && configs=("")
time_old() {
  if [ -n "${AB_ENV_A:-}" ]; then
    env $AB_ENV_A PYTHONPATH=$PWD ABLATE_CONFIG=$2 python3 scripts/ablate.py --time "$1" 2>&1 | tail -1
  elif [ -n "${AB_OLD_TREE:-}" ]; then
    PYTHONPATH=$AB_OLD_TREE ABLATE_CONFIG=$2 python3 "$AB_OLD_TREE/scripts/ablate.py" --time "$1" 2>&1 | tail -1
  else
    PYTHONPATH=$PWD DEEPGEMM_INCLUDE_DIR=$AB_OLD ABLATE_CONFIG=$2 python3 scripts/ablate.py --time "$1" 2>&1 | tail -1
  fi
}
time_new() { env ${AB_ENV_B:-} PYTHONPATH=$PWD ABLATE_CONFIG=$2 python3 scripts/ablate.py --time "$1" 2>&1 | tail -1; }
echo "| shape | config | old µs (2 runs) | new µs (2 runs) | new/old (means) |"
echo "|---|---|---|---|---|"
for shape in "$@"; do
  for cfg in "${configs[@]}"; do
    o1=$(time_old "$shape" "$cfg"); n1=$(time_new "$shape" "$cfg")
    o2=$(time_old "$shape" "$cfg"); n2=$(time_new "$shape" "$cfg")
    ratio=$(python3 -c "print(f'{(float(\"${n1%% *}\") + float(\"${n2%% *}\")) / (float(\"${o1%% *}\") + float(\"${o2%% *}\")):.3f}')" 2>/dev/null || echo "?")
    echo "| $shape | ${n1#* } | ${o1%% *} / ${o2%% *} | ${n1%% *} / ${n2%% *} | $ratio |"
  done
done
