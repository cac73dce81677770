scripts/gpu_check.sh install >/dev/null
for marks in "" full,retired,promoted full,issued,retired,promoted; do
  TRACE_MARKS=$marks TRACE_CONFIG="128,128,1;256,128,1" timeout 120 python3 scripts/trace_consumer.py 4096x7168x16384 2>&1 | tee -a $OUT/trace.txt
done
