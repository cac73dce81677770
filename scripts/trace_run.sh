#!/usr/bin/env bash
# The consumer trace (scripts/trace_consumer.py) of the M = 4096 tiles, untraced and fully stamped, in one
# device call: `scripts/gpu_check.sh install trace`. TRACE_SHAPE and TRACE_CONFIG override the defaults.
export PYTHONPATH=$PWD DEEPGEMM_CACHE_DIR=${DEEPGEMM_CACHE_DIR:-/tmp/deepgemm-cache}
for marks in "" full,issued,retired,promoted; do
  TRACE_MARKS=$marks TRACE_CONFIG="${TRACE_CONFIG:-256,128,1;192,128,1}" timeout 120 \
    python3 scripts/trace_consumer.py "${TRACE_SHAPE:-4096x7168x16384}" 2>&1 | tee -a "${OUT:-/tmp}/trace.txt"
done
