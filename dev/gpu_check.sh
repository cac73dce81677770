#!/usr/bin/env bash
# One device call: install from the carried tree, run the GPU tests, memcheck, host overhead, and
# print the benchmark table last. Full logs go to $OUT. Usage: dev/gpu_check.sh [step ...]
# Steps: install smoke tests files sanitize host sass bench moe repeat breadth grouped kgrouped kgtiles maskedtiles bf16grouped twins ncu ncusource ncubf16 ncugrouped split bf16split clusters tiles placement pdl floor readfloor ab nn route block racecheck bf16 fused training all
# (default: the first seven). nn runs the custom-op / torch.compile / deepgemm.nn GPU tests; route times Fp8Linear
# against BF16 nn.Linear on small weights (dev/fp8_linear_route.py); block runs `deepgemm bench --model`.
# ab times other trees, carried under .ab (dev/rename_package.sh; AB_TREES names them, default deepgemm_old), interleaved
# with this one (dev/ab_trees.py).
# Where .peers/use_deepgemm.sh is carried, DeepGEMM HEAD is made importable first, so bench times it too.
# BUDGET (seconds, default 570) bounds the whole call: every step's timeout is cut to what is left. An unknown step
# name exits 2 at once; the exit status is 1 when a test step failed (or `ab` had no AB_TREES).
# grouped / kgrouped run the grouped tests and dev/bench_grouped.py / dev/bench_kgrouped.py; ncu profiles NCU_SHAPES
# (dev/profile_shape.py; NCU_TILE=BMxBN forces our tile) with the stall reasons; split tests and times the split
# tail / stream tail / split-K (dev/bench_split.py); clusters tests and times the 2-CTA multicast builds
# (dev/dense_tile_ab.py --clusters); tiles times the model's dense picks against other tiles (dev/dense_tile_ab.py).
set -uo pipefail
OUT=${OUT:-/tmp/deepgemm-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-/tmp/deepgemm-cache}
steps=${*:-install smoke tests sanitize host sass bench}
has() { [[ " $steps " == *" $1 "* ]]; }
known=" $(sed -n 's/^# Steps: //p' "$0" | head -1) full "
for step in $steps; do
  [[ "$known" == *" $step "* ]] || { echo "gpu_check: unknown step '$step' (steps:$known)" >&2; exit 2; }
done
# One budget for the whole call (a device command is killed at 600 s): every step's timeout is cut to what is left,
# so a slow step cannot take the later ones down with it. `left N`: min(N, seconds left), at least 1.
deadline=$((SECONDS + ${BUDGET:-570}))
left() { local rest=$((deadline - SECONDS)); (( rest < 1 )) && rest=1; echo $(( $1 < rest ? $1 : rest )); }
status=0  # 1 once a test step fails (the exit status of the call)
failed() { [ "$1" -eq 0 ] || status=1; }

if has install; then
  python3 -m pip install -q --no-deps --no-build-isolation --no-index . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -c "import torch, cuda.bindings; print('torch', torch.__version__, 'cuda-bindings', cuda.bindings.__version__)"
fi
if has smoke; then
  timeout "$(left 120)" python3 dev/sanitize_check.py 2>&1 | tee "$OUT/smoke.log" | tail -12
fi
# tests: the quick GPU subset (-m "gpu and quick": tests/gpu/conftest.py QUICK plus tests marked quick; meant to
# finish within 5 minutes, compiles included), stopping at the first failure; QUICK_MARK overrides the selection.
# full (not a default step): every GPU test (-m full), all failures reported, slowest 30 listed; FULL_MARK narrows it
# (e.g. "full and not quick" after a tests step), FULL_TIMEOUT bounds it. Every GPU test fails if the reference path
# ran on CUDA tensors (the gpu_guard fixture, tests/gpu/guard.py). The memcheck subset is dev/sanitize_check.py: run
# plainly by smoke and under compute-sanitizer memcheck by sanitize.
if has tests; then
  timeout "$(left 420)" python3 -m pytest -x --timeout "$(left 120)" -q -p no:cacheprovider -m "${QUICK_MARK:-gpu and quick}" --durations=20 tests 2>&1 | tee "$OUT/pytest_gpu.log" | grep -E "passed|failed|Error|error" | tail -25; failed "${PIPESTATUS[0]}"
fi
# files: the GPU tests of TEST_FILES (space-separated paths; TEST_K narrows them with -k), every failure reported.
if has files; then
  timeout "$(left "${FILES_TIMEOUT:-300}")" python3 -m pytest --timeout "$(left 150)" -q -p no:cacheprovider \
    ${TEST_K:+-k "$TEST_K"} ${TEST_FILES:?files: set TEST_FILES} 2>&1 | tee "$OUT/pytest_files.log" \
    | grep -E "^(FAILED|ERROR)|passed|failed|rror" | tail -25; failed "${PIPESTATUS[0]}"
fi
# all: every GPU test and racecheck in one call, as four processes at once (the GPU and 16 cores are shared; the
# disk cache is process-safe): the quick subset, the random-shape suite's full part, the rest of the full suite,
# and dev/racecheck_ab.sh. Each writes its own log; the summaries print at the end.
if has all; then
  pt() { timeout "$(left "${ALL_TIMEOUT:-420}")" python3 -m pytest -q --timeout "$(left 200)" -p no:cacheprovider "$@"; }
  pt -m "gpu and quick" tests >"$OUT/all_quick.log" 2>&1 &
  pt -m "full and not quick" tests/gpu/test_random_shapes_gpu.py >"$OUT/all_random.log" 2>&1 &
  pt -m "full and not quick" --ignore=tests/gpu/test_random_shapes_gpu.py \
    -k "not measured_ceilings and not end_to_end" tests >"$OUT/all_full.log" 2>&1 &  # (timing tests: see `full`)
  bash dev/racecheck_ab.sh >"$OUT/all_racecheck.txt" 2>&1 &
  wait
  for log in all_quick all_random all_full; do
    echo "$log: $(grep -E "^(FAILED|ERROR)" "$OUT/$log.log" | head -5) $(tail -1 "$OUT/$log.log")"
    grep -qE "^(FAILED|ERROR)| (failed|error)" "$OUT/$log.log" && status=1
  done
  cat "$OUT/all_racecheck.txt"
fi
if has full; then
  timeout "$(left "${FULL_TIMEOUT:-560}")" python3 -m pytest --timeout "$(left 300)" -q -p no:cacheprovider -m "${FULL_MARK:-full}" --durations=30 tests 2>&1 | tee "$OUT/pytest_full.log" | grep -E "passed|failed|Error|error|slowest|^[0-9.]+s (call|setup|teardown)" | tail -70; failed "${PIPESTATUS[0]}"
fi
if has sanitize; then
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 dev/sanitize_check.py >"$OUT/sanitizer.log" 2>&1
  echo "memcheck exit=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
fi
if has host; then
  timeout "$(left 200)" python3 dev/host_overhead.py 2>&1 | tee "$OUT/host.txt"
fi
if has sass; then
  cubin=$(grep -l "fp8_gemm_nt n=7168 k=16384" "$DEEPGEMM_CACHE_DIR"/kernels/*/*/meta.json 2>/dev/null | head -1 | xargs -r dirname)/kernel.cubin
  if [ -f "$cubin" ]; then
    cuobjdump --dump-sass "$cubin" >"$OUT/largest_kernel.sass" 2>&1
    echo "sass (n=7168 k=16384 GEMM): QGMMA=$(grep -c QGMMA "$OUT/largest_kernel.sass") LDL/STL=$(grep -cE 'LDL|STL' "$OUT/largest_kernel.sass")"
  fi
fi
if has nn; then
  timeout "$(left 400)" python3 -m pytest -x --timeout "$(left 200)" -q -p no:cacheprovider tests/gpu/test_ops_gpu.py 2>&1 | tee "$OUT/pytest_nn.log" | grep -E "passed|failed|Error|error" | tail -25; failed "${PIPESTATUS[0]}"
fi
if has route; then
  timeout "$(left 300)" python3 dev/fp8_linear_route.py 2>&1 | tee "$OUT/route.md"
fi
if has block; then
  for model in ${BLOCK_MODELS:-llama-3-8b qwen3-30b-a3b}; do
    timeout "$(left 300)" python3 -m deepgemm bench --model $model --tokens 1,64,4096 --json "$OUT/block_$model.json" --markdown "$OUT/block_$model.md" 2>&1 | tee "$OUT/block_$model.txt"
  done
fi
# bf16: the BF16 GEMM GPU tests, then `deepgemm bench --dtype bf16` per layout on the DeepSeek-V3 suite (cuBLAS and,
# where carried, DeepGEMM HEAD interleaved); BF16_LAYOUTS narrows the layouts.
if has bf16; then
  timeout "$(left 90)" python3 dev/bf16_smoke.py 2>&1 | tee "$OUT/bf16_smoke.log" | tail -8
  timeout "$(left 300)" python3 -m pytest -x --timeout "$(left 60)" -q -p no:cacheprovider tests/gpu/test_bf16_gemm_gpu.py 2>&1 | tee "$OUT/pytest_bf16.log" | grep -E "passed|failed|Error|error" | tail -25; failed "${PIPESTATUS[0]}"
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    for layout in ${BF16_LAYOUTS:-nt nn tn tt}; do
      timeout "$(left "${BF16_TIMEOUT:-300}")" python3 -m deepgemm bench --dtype bf16 --layout "$layout" --suite deepseek-v3 \
        --json "$OUT/bench_bf16_$layout.json" --markdown "/tmp/bench_bf16_$layout.md" >"/tmp/bench_bf16_$layout.log" 2>&1
      grep -E "summary|rror" "/tmp/bench_bf16_$layout.log"
    done )
fi
# fused: the softmax / RoPE GPU tests, then dev/bench_softmax_rope.py (against torch eager and torch.compile;
# FUSED_ARGS e.g. --no-compile or --only rope).
if has fused; then
  timeout "$(left 240)" python3 -m pytest --timeout "$(left 120)" -q -p no:cacheprovider tests/gpu/test_softmax_rope_gpu.py 2>&1 \
    | tee "$OUT/pytest_fused.log" | grep -E "^(FAILED|ERROR)|passed|failed|rror" | tail -25; failed "${PIPESTATUS[0]}"
  timeout "$(left 300)" python3 dev/bench_softmax_rope.py ${FUSED_ARGS:-} 2>&1 | tee "$OUT/bench_fused.md"
fi
# training: the FP8 training GPU tests (deepgemm.fp8_linear, the transposed quantizer), then dev/bench_fp8_training.py.
if has training; then
  timeout "$(left 300)" python3 -m pytest --timeout "$(left 150)" -q -p no:cacheprovider tests/gpu/test_fp8_training_gpu.py 2>&1 \
    | tee "$OUT/pytest_training.log" | grep -E "^(FAILED|ERROR)|passed|failed|rror" | tail -25; failed "${PIPESTATUS[0]}"
  timeout "$(left 300)" python3 dev/bench_fp8_training.py ${TRAINING_ARGS:-} 2>&1 | tee "$OUT/bench_training.md"
fi
if has racecheck; then
  bash dev/racecheck_ab.sh
fi
# ab: the packages of AB_TREES (default deepgemm_old; several are timed together), carried under .ab, with AB_ARGS
# (e.g. "--m 512,1024 --more") passed on.
if has ab; then
  if [ -z "${AB_TREES:-}" ]; then
    echo "ab: set AB_TREES to the packages carried under .ab ($(ls .ab 2>/dev/null | tr '\n' ' '))"; status=1
  else
    timeout "$(left "${AB_TIMEOUT:-300}")" env PYTHONPATH=$PWD:$PWD/.ab python3 dev/ab_trees.py $AB_TREES ${AB_ARGS:-} 2>&1 \
      | tee "$OUT/ab_trees.md"
  fi
fi
# bench: BENCH_SUITES (default deepseek-v3) one after another, L2 flushed the BENCH_FLUSH way (zero or read; default
# zero); $OUT/bench.json for deepseek-v3, $OUT/<suite>.json for the others.
if has bench; then
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    for suite in ${BENCH_SUITES:-deepseek-v3}; do
      name=$([ "$suite" = deepseek-v3 ] && echo bench || echo "$suite")
      timeout "$(left 400)" python3 -m deepgemm bench --suite "$suite" --flush "${BENCH_FLUSH:-zero}" --json "$OUT/$name.json" \
        --markdown "/tmp/$name.md" >"/tmp/$name.log" 2>&1
      echo "$suite (flush ${BENCH_FLUSH:-zero}):"
      grep -E "deepgemm |deepseek|blockwise|geometric|rror|left out" "/tmp/$name.log"
    done )
fi
# repeat: the dense and MoE suites REPEAT times (default 2), JSON only ($OUT/bench_<i>.json, moe_<i>.json: few files, as
# a device call returns at most eight), the summary lines printed, then the per-run ratio tables (dev/runs_table.py, printed
# only: with install.log and gpu.txt, REPEAT=3 fills the eight files a call returns).
if has repeat; then
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    for i in $(seq 1 "${REPEAT:-2}"); do
      for suite in deepseek-v3 deepseek-v3-moe; do
        name=$([ $suite = deepseek-v3 ] && echo bench || echo moe)_$i
        timeout "$(left 400)" python3 -m deepgemm bench --suite $suite --json "$OUT/$name.json" --markdown /tmp/$name.md \
          >/tmp/$name.log 2>&1
        echo "$name: $(grep -E "^summary|rror" /tmp/$name.log | cut -c1-150)"
      done
    done
    python3 dev/runs_table.py "$OUT"/bench_*.json
    python3 dev/runs_table.py "$OUT"/moe_*.json )
fi
# moe / breadth: `deepgemm bench --suite deepseek-v3-moe` (grouped cases, DeepGEMM interleaved) in each of MOE_DTYPES
# (default fp8; bf16 adds torch._grouped_mm: $OUT/moe_bf16.*; MOE_TIMEOUT bounds each, default 480 s) and `--suite
# llm-prefill` (48 dense prefill shapes), results under $OUT.
if has moe; then
  for dtype in ${MOE_DTYPES:-fp8}; do
    name=$([ "$dtype" = fp8 ] && echo moe || echo "moe_$dtype")
    ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
      timeout "$(left "${MOE_TIMEOUT:-480}")" python3 -m deepgemm bench --suite deepseek-v3-moe --dtype "$dtype" --json "$OUT/$name.json" \
        --markdown "$OUT/$name.md" >"$OUT/$name.log" 2>&1 )
    grep -E "geometric|summary|rror|left out" "$OUT/$name.log"
  done
fi
if has breadth; then
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    timeout "$(left "${BREADTH_TIMEOUT:-540}")" python3 -m deepgemm bench --suite llm-prefill --json "$OUT/llm_prefill.json" \
      --markdown "$OUT/llm_prefill.md" >"$OUT/llm_prefill.log" 2>&1 )
  grep -E "geometric|summary|rror|left out" "$OUT/llm_prefill.log"
fi
if has grouped; then
  timeout "$(left 300)" python3 -m pytest -x --timeout "$(left 120)" -q -p no:cacheprovider tests/gpu/test_grouped_gpu.py 2>&1 | tee "$OUT/pytest_grouped.log" | grep -E "passed|failed|Error|error" | tail -15; failed "${PIPESTATUS[0]}"
  timeout "$(left 200)" python3 dev/bench_grouped.py 2>&1 | tee "$OUT/bench_grouped.md"
fi
if has ncu; then
  for tag in ${NCU_SHAPES:-4096x7168x16384}; do
    shape=$(echo $tag | tr x ' ')
    stalls=$(for r in barrier long_scoreboard wait math_pipe_throttle mio_throttle membar sleeping short_scoreboard dispatch_stall misc no_instruction branch_resolving selected not_selected lg_throttle; do printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," $r; done)
    for who in ours ${NCU_PEER:+peer}; do
      # The peer (NCU_PEER=1, DeepGEMM HEAD made importable first) on the same operands, the same metrics.
      ( [ "$who" = peer ] && [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
        timeout "$(left 240)" ncu --clock-control none -k regex:fp8_gemm --launch-skip 1 --launch-count 1 --section SpeedOfLight --section LaunchStats \
          --metrics ${stalls}l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum,lts__t_sectors.sum,dram__bytes.sum,sm__cycles_active.avg,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_uniform.sum,smsp__inst_executed_op_shared_ld.sum \
          python3 dev/profile_shape.py $shape $([ "$who" = peer ] && echo --peer) $([ "$who" = ours ] && [ -n "${NCU_TILE:-}" ] && echo --tile "$NCU_TILE") >"$OUT/ncu_${tag}_$who.txt" 2>&1 )
      echo "ncu $tag $who:"; grep -E "Duration|SM Frequency|stalled|pipe_|bank_conflicts|wavefronts|inst_executed|sectors|dram__bytes|cycles_active|Grid Size|Registers Per|Shared Memory Config|Dynamic Shared|Cluster Size" "$OUT/ncu_${tag}_$who.txt" | awk '{print $1, $NF}' | head -40
    done
  done
fi
# ncusource: per-instruction stall sampling (`--set full`, source page as CSV) of NCU_SHAPES (one shape) for our build
# (NCU_TILE forces the tile, dev/dense_tile_ab.py's suffixes) and DeepGEMM HEAD, plus the L2 traffic split (SM reads,
# hits, misses, fabric); $OUT/{ours,peer}_source.csv, summarized by dev/ncu_source.py. NCU_PACKAGE=NAME adds another
# tree's build of the same tile (carried under .ab, dev/rename_package.sh) as $OUT/tree_source.csv. The L2 metrics are
# also taken for ours and DeepGEMM's in one process on the same tensors; every metric line also goes to
# $OUT/ncu_metrics.txt.
if has ncusource; then
  l2=gpu__time_duration.sum,sm__cycles_active.avg,smsp__inst_executed.sum,lts__t_sectors.sum,lts__t_requests.sum,lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_tex_lookup_hit.sum,lts__t_sectors_srcunit_tex_lookup_miss.sum,lts__t_sectors_srcunit_ltcfabric.sum,dram__bytes_read.sum
  l2=$l2,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex.sum,lts__t_sectors_srcunit_ltcfabric_lookup_hit.sum,lts__t_sectors_srcunit_ltcfabric_lookup_miss.sum,lts__t_sectors_srcnode_gpc.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio
  shape=$(echo ${NCU_SHAPES:-512x4096x7168} | cut -d' ' -f1 | tr x ' ')
  # NCU_SOURCE=0: only the one-process metrics below (no per-instruction profiles).
  for who in $([ "${NCU_SOURCE:-1}" = 0 ] || echo ours peer ${NCU_PACKAGE:+tree}); do
    ( if [ $who = peer ]; then [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh; args=--peer; else args=${NCU_TILE:+--tile $NCU_TILE}; fi
      if [ $who = tree ]; then export PYTHONPATH=$PYTHONPATH:$PWD/.ab; args="$args --package $NCU_PACKAGE"; fi
      timeout "$(left 240)" ncu --clock-control none -k regex:fp8_gemm --launch-skip 1 --launch-count 1 --set full --import-source no -f -o /tmp/ncu_$who \
        python3 dev/profile_shape.py $shape $args >/tmp/ncu_$who.log 2>&1
      ncu -i /tmp/ncu_$who.ncu-rep --page source --csv --print-source sass >"$OUT/${who}_source.csv" 2>&1
      echo "ncu $who ($shape):" | tee -a "$OUT/ncu_metrics.txt"
      timeout "$(left 120)" ncu --clock-control none -k regex:fp8_gemm --launch-skip 1 --launch-count 1 --metrics $l2 python3 dev/profile_shape.py $shape $args 2>&1 \
        | grep -E "^\s+(gpu__|sm__|smsp__|lts__|dram__)" | awk '{print $1, $NF}' | tee -a "$OUT/ncu_metrics.txt" )
  done
  # The same metrics for ours and DeepGEMM's in one process on the same tensors (launches 3 and 4 of
  # `profile_shape.py --both`: ours, then DeepGEMM's), so placement cannot tell the L2 counters apart.
  echo "ncu ours then peer, one process ($shape):" | tee -a "$OUT/ncu_metrics.txt"
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    timeout "$(left 120)" ncu --clock-control none -k regex:fp8_gemm --launch-skip 2 --launch-count 2 --metrics $l2 \
      python3 dev/profile_shape.py $shape --both ${NCU_TILE:+--tile $NCU_TILE} 2>&1 \
      | grep -v "==PROF==" | grep -E "fp8_gemm.*\(|^\s+(gpu__|sm__|smsp__|lts__|dram__)" \
      | awk '/fp8_gemm/ {print substr($0, 1, 70); next} {print $1, $NF}' | tee -a "$OUT/ncu_metrics.txt" )
  [ "${NCU_SOURCE:-1}" = 0 ] || python3 dev/ncu_source.py "$OUT/ours_source.csv" "$OUT/peer_source.csv" ${NCU_PACKAGE:+"$OUT/tree_source.csv"} --top 12
fi
# ncubf16: per-instruction stall sampling (`--set full`) of our BF16 kernel on NCU_BF16_SHAPE (default
# 4096x28672x512, NT) for each tile of NCU_BF16_TILES (dev/profile_bf16.py's --tile: BMxBN, `w` whole staging buffer,
# `k` chunked; default the 224- and 256-wide tiles, whose per-tile cost at short K the model lacks) and DeepGEMM HEAD;
# $OUT/bf16_<tile>_source.csv and key metrics from each report, summarized by dev/ncu_source.py.
if has ncubf16; then
  shape=$(echo ${NCU_BF16_SHAPE:-4096x28672x512} | tr x ' ')
  csvs=""
  for tile in ${NCU_BF16_TILES:-128x224 128x256} peer; do
    ( if [ $tile = peer ]; then [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh; args=--peer; kernel=regex:sm90_bf16; else args="--tile $tile"; kernel=regex:deepgemm_bf16; fi
      timeout "$(left 200)" ncu --clock-control none -k $kernel --launch-skip 1 --launch-count 1 --set full --import-source no -f -o /tmp/ncu_bf16_$tile \
        python3 dev/profile_bf16.py $shape $args >/tmp/ncu_bf16_$tile.log 2>&1
      ncu -i /tmp/ncu_bf16_$tile.ncu-rep --page source --csv --print-source sass >"$OUT/bf16_${tile}_source.csv" 2>&1
      echo "ncu bf16 $tile ($shape): $(grep '^ours' /tmp/ncu_bf16_$tile.log)" | tee -a "$OUT/ncu_bf16_metrics.txt"
      ncu -i /tmp/ncu_bf16_$tile.ncu-rep --page raw --csv 2>/dev/null | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
want = ["gpu__time_duration.sum", "sm__cycles_active.avg", "smsp__cycles_active.avg", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "sm__inst_executed_pipe_tensor_op_hmma.sum", "smsp__inst_executed.sum", "lts__t_sectors.sum", "lts__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__bytes_read.sum", "dram__bytes_write.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "smsp__warps_issue_stalled_barrier",
        "launch__grid_size", "launch__registers_per_thread", "sm__cycles_elapsed.avg.per_second"]
if len(rows) > 2:
    for name, unit, value in zip(rows[0], rows[1], rows[2]):
        if any(name.startswith(w) for w in want):
            print(" ", name, value, unit)
' | tee -a "$OUT/ncu_bf16_metrics.txt" )
    csvs="$csvs $OUT/bf16_${tile}_source.csv"
  done
  python3 dev/ncu_source.py $csvs --top 15
fi
# ncugrouped: ncu over `dev/grouped_tile_ab.py --profile $NCU_GROUPED_ARGS` (every fp8_gemm kernel it launches, ours and
# DeepGEMM HEAD's, in the order it prints; DG_PRINT_CONFIGS=1 shows DeepGEMM's config), the same metrics as ncu.
if has ncugrouped; then
  stalls=$(for r in barrier long_scoreboard wait math_pipe_throttle mio_throttle short_scoreboard no_instruction; do printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," $r; done)
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    DG_PRINT_CONFIGS=1 ncu --clock-control none -k regex:fp8_gemm --section SpeedOfLight --section LaunchStats \
      --metrics ${stalls}sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,lts__t_sectors.sum,dram__bytes.sum,sm__cycles_active.avg \
      python3 dev/grouped_tile_ab.py --profile ${NCU_GROUPED_ARGS:---masked --tiles 128x128} >"$OUT/ncu_grouped.txt" 2>&1 )
  grep -E "profiled:|DG_|config|BLOCK|block_m|Duration|SM Frequency|stalled|pipe_tensor|inst_executed|sectors|dram__bytes|cycles_active|Grid Size|Registers Per|Cluster Size|fp8_gemm" "$OUT/ncu_grouped.txt" | awk '{$1=$1; print}' | cut -c1-160 | head -${NCU_GROUPED_LINES:-150}
fi
# twins: contiguous (128 x 192, N = 4096) and masked (128 x 128, max_m 4096, N = 4096) cases each against a dense GEMM
# of as many rows on the same tile, ours and DeepGEMM HEAD's, all interleaved (dev/grouped_tile_ab.py --dense-twin):
# whether a grouped gap to DeepGEMM is the grouped path's own or the dense kernel's.
if has twins; then
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    timeout "$(left 150)" python3 dev/grouped_tile_ab.py --dense-twin --tiles 128x192 --only N=4096 2>&1 | tee "$OUT/contiguous_twins.md"
    timeout "$(left 90)" python3 dev/grouped_tile_ab.py --dense-twin --masked --tiles 128x128 --only "(max_m 4096) N=4096" 2>&1 \
      | tee "$OUT/masked_twins.md" )
fi
if has kgrouped; then
  timeout "$(left 200)" python3 dev/bench_kgrouped.py 2>&1 | tee "$OUT/bench_kgrouped.md"
fi
# kgtiles: the FP8 k-grouped epilogue and tile builds against DeepGEMM HEAD (dev/kgrouped_fp8_epilogue_ab.py, in trees
# that have it; KGTILES_ARGS e.g. --only 4096), DeepGEMM printing the config it ran. maskedtiles: the masked cases on
# the API's pick and other tiles (dev/grouped_tile_ab.py --masked; MASKED_TILES, default pick,128x128,256x128,128x192;
# MASKED_ARGS e.g. --only "N=4096 K=7168" --rows-scale 1.0,1.22), DeepGEMM HEAD interleaved.
if has kgtiles; then
  if [ -f dev/kgrouped_fp8_epilogue_ab.py ]; then
    ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
      DG_PRINT_CONFIGS=1 timeout "$(left "${KGTILES_TIMEOUT:-300}")" python3 dev/kgrouped_fp8_epilogue_ab.py ${KGTILES_ARGS:-} 2>&1 \
        | tee "$OUT/kgtiles.md" )
  else
    echo "kgtiles: dev/kgrouped_fp8_epilogue_ab.py is not in this tree"
  fi
fi
if has maskedtiles; then
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    DG_PRINT_CONFIGS=1 timeout "$(left "${MASKED_TIMEOUT:-300}")" python3 dev/grouped_tile_ab.py --masked \
      --tiles "${MASKED_TILES:-pick,128x128,256x128,128x192}" ${MASKED_ARGS:-} 2>&1 | tee "$OUT/maskedtiles.md" )
fi
# bf16grouped: the BF16 grouped GPU tests, then dev/bench_grouped_bf16.py (the grouped forms against DeepGEMM HEAD
# where carried, and torch._grouped_mm).
if has bf16grouped; then
  timeout "$(left 240)" python3 -m pytest --timeout "$(left 150)" -q -p no:cacheprovider tests/gpu/test_bf16_grouped_gpu.py 2>&1 | tee "$OUT/pytest_bf16_grouped.log" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -25; failed "${PIPESTATUS[0]}"
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    timeout "$(left 300)" python3 dev/bench_grouped_bf16.py --json "$OUT/bench_grouped_bf16.json" 2>&1 | tee "$OUT/bench_grouped_bf16.md" )
fi
# bf16split: the BF16 split-K and FP8 split-tail GPU tests, then dev/bench_bf16_split.py (decode shapes, peers
# interleaved; BF16SPLIT_ARGS passes shapes and --layout=L instead).
if has bf16split; then
  timeout "$(left 300)" python3 -m pytest --timeout "$(left 120)" -q -p no:cacheprovider tests/gpu/test_bf16_split_k_gpu.py \
    tests/gpu/test_split_tail_gpu.py 2>&1 | tee "$OUT/pytest_bf16split.log" | grep -E "passed|failed|Error|error" | tail -25
  failed "${PIPESTATUS[0]}"
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    timeout "$(left 240)" python3 dev/bench_bf16_split.py ${BF16SPLIT_ARGS:-} 2>&1 | tee "$OUT/bench_bf16_split.md" )
fi
if has split; then
  timeout "$(left 300)" python3 -m pytest -x --timeout "$(left 120)" -q -p no:cacheprovider tests/gpu/test_split_tail_gpu.py 2>&1 | tee "$OUT/pytest_split.log" | grep -E "passed|failed|Error|error" | tail -8; failed "${PIPESTATUS[0]}"
  timeout "$(left 300)" python3 dev/bench_split.py 2>&1 | tee "$OUT/bench_split.md"
fi
# clusters: the 2-CTA multicast GPU tests (A and B), then dev/dense_tile_ab.py --clusters (the model's pick against its
# multicast builds at M = 4096, DeepGEMM HEAD interleaved where carried).
if has clusters; then
  timeout "$(left 150)" python3 -m pytest -q --timeout "$(left 120)" -p no:cacheprovider tests/gpu/test_fp8_gemm_gpu.py -k multicast 2>&1 \
    | tee "$OUT/pytest_multicast.log" | grep -E "^(FAILED|ERROR)|passed|failed" | tail -6
  failed "${PIPESTATUS[0]}"
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    export PYTHONPATH=$PWD:$PYTHONPATH
    timeout "$(left 200)" python3 dev/dense_tile_ab.py --clusters 2>&1 | tee "$OUT/cluster_ab.md" )
fi
# placement: dev/placement_ab.py $PLACEMENT_ARGS (ours against DeepGEMM HEAD with the tensors placed elsewhere in
# device memory: how much the harness's placement moves a same-run ratio).
if has placement; then
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    export PYTHONPATH=$PWD:$PYTHONPATH
    timeout "$(left "${PLACEMENT_TIMEOUT:-300}")" python3 dev/placement_ab.py ${PLACEMENT_ARGS:-} 2>&1 | tee "$OUT/placement.md" )
fi
# pdl: chains of quantize + GEMM links (and GEMM-only links) in one CUDA graph with programmatic dependent launch off
# and on, interleaved (dev/pdl_ab.py $PDL_ARGS).
if has pdl; then
  timeout "$(left "${PDL_TIMEOUT:-300}")" python3 dev/pdl_ab.py ${PDL_ARGS:-} 2>&1 | tee "$OUT/pdl.md"
fi
# floor: what the bench's method measures for (almost) no work: empty kernels, a tiny torch op, copies, decode GEMMs
# (dev/harness_floor.py $FLOOR_ARGS).
if has floor; then
  timeout "$(left "${FLOOR_TIMEOUT:-200}")" python3 dev/harness_floor.py ${FLOOR_ARGS:-} 2>&1 | tee "$OUT/floor.md"
fi
# readfloor: dev/read_floor.py $READFLOOR_ARGS (decode GEMMs and their peers against a kernel that only reads the
# bytes they must move, interleaved, under both flushes).
if has readfloor; then
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    timeout "$(left "${READFLOOR_TIMEOUT:-300}")" python3 dev/read_floor.py ${READFLOOR_ARGS:-} 2>&1 | tee "$OUT/read_floor.md" )
fi
# tiles: dev/dense_tile_ab.py $TILE_ARGS (default: the twelve M <= 128 DeepSeek-V3 shapes on a spread of tiles), the
# model's pick and DeepGEMM HEAD interleaved; DG_PRINT_CONFIGS=1 shows DeepGEMM's config per shape; `--trees` finds the
# packages carried under .ab.
if has tiles; then
  ( [ -f .peers/use_deepgemm.sh ] && . .peers/use_deepgemm.sh
    export PYTHONPATH=$PWD:$PWD/.ab:$PYTHONPATH
    spread=64x16,64x32,64x64,64x96,64x128,64x128u,64x160,64x192,128x64,128x96,128x128,128x192
    DG_PRINT_CONFIGS=1 timeout "$(left "${TILE_TIMEOUT:-300}")" python3 dev/dense_tile_ab.py ${TILE_ARGS:---tiles $spread} 2>&1 \
      | tee "$OUT/tiles.md" )
fi
exit "$status"
