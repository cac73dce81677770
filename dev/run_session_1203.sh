#!/usr/bin/env bash
# One device call of 2026-12-03: ncu of ours and DeepGEMM HEAD (M = 4096), the A-multicast GPU tests and A/B, the
# BF16 grouped tests, the FP32-output chunked A/B and the k-grouped tile probe. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/deepgemm-out}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-/tmp/deepgemm-cache}
bash dev/gpu_check.sh install | grep -v "^torch"
timeout 150 python3 -m pytest -q --timeout 120 -p no:cacheprovider tests/gpu/test_fp8_gemm_gpu.py -k "multicast" \
  >"$OUT/pytest_multicast.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_multicast.log" | tail -6
( . .peers/use_deepgemm.sh; export PYTHONPATH=$PWD:$PYTHONPATH
  timeout 200 python3 dev/cluster_ab.py 2>&1 | tee "$OUT/cluster_ab.md" | grep -v '^|---' )
[ -n "${NCU:-}" ] && NCU_PEER=1 NCU_SHAPES="${NCU_SHAPES:-4096x7168x16384}" timeout 200 bash dev/gpu_check.sh ncu 2>&1 | tee "$OUT/ncu_part.txt"
if [ -n "${BF16:-}" ]; then
  BF16_TESTS="tests/gpu/test_bf16_grouped_gpu.py" TESTS_TIMEOUT=120 BF16_LAYOUTS= PROBE_LAYOUTS= DENSE_FP32=1 \
    KGROUPED_CASES="4:4096:4096:4096 8:4096:7168:7168 4:4096:4096:7168" timeout 300 bash dev/run_bf16_session.sh 2>&1 | tail -50
fi
