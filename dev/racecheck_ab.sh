#!/usr/bin/env bash
# racecheck over 1D2D GEMMs whose tile loader fills the tile slots (block_m 192/256): two split-tail configs and a
# whole-tile one. Finding (H200, 2026-12-01): with the slots' "empty" barrier armed by one elected lane per warp
# after __syncwarp, racecheck reported WAR hazards between the math threads' reads of a slot header and the loader's
# next write of it (split-tail launches only; the numbers were right); with every math thread arriving it reported
# none, so racecheck does not model a warp's release through __syncwarp + one lane's arrive. The slots now take
# per-thread arrivals (once per tile); this check must report 0 hazards.
set -uo pipefail
OUT=${OUT:-/tmp/deepgemm-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
cat >/tmp/race_shapes.py <<'PY'
import torch, deepgemm
from deepgemm.kernels.sm90_fp8_gemm_1d2d.cost_model import make_config
from deepgemm.kernels.sm90_fp8_gemm_1d2d.plan import get_plan
from tests.helpers import random_operands, reference_fp64
# The memcheck subset's split-tail tiles (the tile loader's slots in use, each K range's unit in the slot header),
# where racecheck reported hazards over dev/sanitize_check.py, and a whole-tile loader config, where it reported none.
for m, n, k, bm, bn, sms, split in [(700, 1000, 2048, 192, 128, 30, True), (300, 2112, 7296, 256, 128, 30, True),
                                     (300, 2112, 2048, 256, 128, 16, False)]:
    a, b = random_operands(m, n, k, "cuda", seed=m + n + k)
    plan = get_plan(0, m, n, k, torch.bfloat16, config=make_config(m, n, k, bm, bn, sms, split_tail=split))
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    plan.launch(a[0], a[1], b[0], b[1], out)
    torch.cuda.synchronize()
    print(f"racecheck {plan.spec.label()}: calc_diff={deepgemm.calc_diff(out.double(), reference_fp64(a, b)):.2e}", flush=True)
PY
for name in tree; do
  DEEPGEMM_CACHE_DIR=/tmp/race-cache-$name timeout 110 compute-sanitizer --tool racecheck --print-limit 5 \
    python3 /tmp/race_shapes.py >"$OUT/racecheck_$name.log" 2>&1
  echo "racecheck $name: exit=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck_$name.log" | tail -1) $(grep -c 'calc_diff' "$OUT/racecheck_$name.log") shapes"
  grep -E "Race reported|Write access|^racecheck" "$OUT/racecheck_$name.log" | head -8
done
