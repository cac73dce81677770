#!/usr/bin/env bash
# racecheck over a 1D2D GEMM with two math warpgroups (the tile loader's slots in use), as the tree
# is and with the tile slots' "empty" barrier armed by every math lane instead of one elected lane per warp
# (headers copied to $OUT/include_all_lanes, selected with DEEPGEMM_INCLUDE_DIR). Equal hazard counts mean the
# pattern is not what racecheck flags; zero for the variant means racecheck does not model a warp's release
# through __syncwarp + one lane's mbarrier.arrive.
set -uo pipefail
OUT=${OUT:-/tmp/deepgemm-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
variant="$OUT/include_all_lanes"
rm -rf "$variant" && cp -r deepgemm/include "$variant"
loader="$variant/deepgemm/mainloop/sm90_fp8_1d2d_tile_loader.cuh"
python3 - "$loader" <<'PY'
import sys
from pathlib import Path
p = Path(sys.argv[1]); s = p.read_text()
s = s.replace("ptx::mbarrier_init(empty(s), Cfg::kNumMathThreads / 32);", "ptx::mbarrier_init(empty(s), Cfg::kNumMathThreads);")
old = """        __syncwarp();
        if (ptx::elect_one_lane()) {
            ptx::mbarrier_arrive(empty(use));
        }"""
assert old in s
s = s.replace(old, "        ptx::mbarrier_arrive(empty(use));")
p.write_text(s)
PY
cat >"$OUT/race_shapes.py" <<'PY'
import torch, deepgemm
from tests.helpers import random_operands, reference_fp64
for m, n, k in [(768, 1536, 512)]:  # block_m 128: two math warpgroups, the loader warp
    a, b = random_operands(m, n, k, "cuda", seed=m)
    out = deepgemm.fp8_gemm_nt(a, b)
    torch.cuda.synchronize()
    print(f"racecheck m={m} n={n} k={k}: calc_diff={deepgemm.calc_diff(out.double(), reference_fp64(a, b)):.2e}")
PY
for name in tree all_lanes; do
  if [ $name = all_lanes ]; then export DEEPGEMM_INCLUDE_DIR="$variant"; fi
  DEEPGEMM_CACHE_DIR=/tmp/race-cache-$name timeout 110 compute-sanitizer --tool racecheck --print-limit 5 \
    python3 "$OUT/race_shapes.py" >"$OUT/racecheck_$name.log" 2>&1
  echo "racecheck $name: exit=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck_$name.log" | tail -1) $(grep -c 'calc_diff' "$OUT/racecheck_$name.log") shapes"
done
