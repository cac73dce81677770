#!/usr/bin/env bash
# BF16 device call: install, the BF16 GPU tests (BF16_TESTS: split-K and the layout suite), memcheck of
# dev/sanitize_check.py (SANITIZE=1), `deepgemm bench --dtype bf16` in every layout of BF16_LAYOUTS with DeepGEMM HEAD
# and cuBLAS, the split-K / tuned-tile probe in PROBE_LAYOUTS, the k-grouped tile probe (KGROUPED_CASES; KGROUPED=0 skips it) and with
# DENSE_FP32=1 its dense FP32-output chunked-epilogue A/B. An empty list skips its step. Logs under $OUT; the tables
# print last.
set -uo pipefail
OUT=${OUT:-/tmp/deepgemm-out}
mkdir -p "$OUT"
bash dev/gpu_check.sh install
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-/tmp/deepgemm-cache}
BF16_TESTS=${BF16_TESTS-tests/gpu/test_bf16_split_k_gpu.py tests/gpu/test_bf16_gemm_gpu.py}
if [ -n "$BF16_TESTS" ]; then
  # shellcheck disable=SC2086 - a list of paths
  timeout ${TESTS_TIMEOUT:-170} python3 -m pytest -q --timeout 120 -p no:cacheprovider $BF16_TESTS \
    >"$OUT/pytest_bf16.log" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_bf16.log" | tail -8
fi
if [ -n "${SANITIZE:-}" ]; then
  timeout 240 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 dev/sanitize_check.py \
    >"$OUT/sanitizer.log" 2>&1
  echo "memcheck exit=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
  grep -E "k_grouped" "$OUT/sanitizer.log" | tail -6
fi
[ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
export PYTHONPATH=$PWD:$PYTHONPATH
# WARM=1: one untimed pass first, every layout of BF16_LAYOUTS and every third of the suite in its own process at the
# same time (--iters 1), so DeepGEMM's JIT compiles (seconds per shape and layout) run in parallel on the host's cores;
# the timed runs below then find every kernel compiled.
if [ -n "${WARM:-}" ]; then
  thirds=()  # the suite's shapes as --shape arguments, every third one
  for third in 0 1 2; do
    thirds+=("$(python3 -c "from deepgemm.bench.suites import suite_shapes
print(' '.join(f'--shape {m},{n},{k}' for m, n, k in suite_shapes('deepseek-v3')[$third::3]))")")
  done
  for layout in ${BF16_LAYOUTS-nt nn tn tt}; do
    for third in 0 1 2; do
      # shellcheck disable=SC2086 - one --shape argument per shape
      timeout ${WARM_TIMEOUT:-240} python3 -m deepgemm bench --dtype bf16 --layout "$layout" --iters 1 --warmup 1 --no-graph \
        ${thirds[$third]} \
        --json "/tmp/warm_${layout}_$third.json" --markdown "/tmp/warm_${layout}_$third.md" >"/tmp/warm_${layout}_$third.log" 2>&1 &
    done
  done
  wait
  echo "warm: $(grep -h "^summary" /tmp/warm_*.log | wc -l) passes; $(grep -lE "rror" /tmp/warm_*.log | wc -l) with errors"
fi
for layout in ${BF16_LAYOUTS-nt nn tn tt}; do
  timeout 150 python3 -m deepgemm bench --dtype bf16 --layout "$layout" --suite deepseek-v3 \
    --json "$OUT/bench_$layout.json" --markdown "/tmp/bench_$layout.md" >"/tmp/bench_$layout.log" 2>&1
  grep -E "summary|rror" "/tmp/bench_$layout.log"
done
for layout in ${PROBE_LAYOUTS-nn tn tt}; do
  timeout 60 python3 dev/bench_bf16_split.py --layout=$layout ${PROBE_SHAPES:-"128x24576x1536:64,192" \
    "128x7168x16384:64,128" "128x7168x2048:64,128" "64x7168x2048:64,128"} 2>&1 | grep -v '^|---'
done
[ -n "${DENSE_FP32:-}" ] && timeout 60 python3 dev/kgrouped_bf16_tiles.py --dense 2>&1 | grep -v '^|---'
# shellcheck disable=SC2086 - a list of cases (empty: the probe's defaults; KGROUPED=0 skips the probe)
[ "${KGROUPED:-1}" = 0 ] || timeout 150 python3 dev/kgrouped_bf16_tiles.py ${KGROUPED_CASES:-} 2>&1
# FP8 masked groups at N = 7168, K = 2048: 128 x 192 against the model's 128 x 128 (DeepGEMM HEAD interleaved).
if [ -n "${MASKED_AB:-}" ]; then
  for scale in 1.0 1.22; do
    timeout 90 python3 dev/grouped_tile_ab.py --masked --only "N=7168 K=2048" --tiles 128x128,128x192 \
      --rows-scale "$scale" 2>&1 | grep -E '^\|' | grep -v '^|---'
  done
fi
