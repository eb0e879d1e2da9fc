#!/bin/bash
# Session 29, call 1: the direct verify's tests, timings against main (baec86e) and an ncu of the
# 16-row verify instance, before the gate. Everything into $OUT/q.tar.xz.
set -u
t0=$SECONDS
R=$OUT/q; mkdir -p $R
trap 'echo "end at $((SECONDS - t0))" >> $R/times.txt; tar -cJf $OUT/q.tar.xz -C $OUT q' EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
mkdir -p /tmp/v && tar -xJf .devpack/gate/val.tar.xz -C /tmp/v
B=/tmp/v/build-device/bin
(timeout 110 $B/kvlayer fuzz --cases 1000000 --minutes 1.5 --seed 291 --head-dim 128 --max-gqa 8 --replay-dir $R > $R/fuzz-a.txt 2>&1; echo "exit $?" >> $R/fuzz-a.txt) &
(timeout 110 $B/kvlayer fuzz --cases 1000000 --minutes 1.5 --seed 292 --head-dim 128 --max-gqa 4 --longest 16384 --replay-dir $R > $R/fuzz-b.txt 2>&1; echo "exit $?" >> $R/fuzz-b.txt) &
timeout 100 $B/kvlayer_cuda_layer_tests --gtest_filter='*Verify*' > $R/layer-verify.txt 2>&1; echo "exit $?" >> $R/layer-verify.txt
echo "layer verify at $((SECONDS - t0))" >> $R/times.txt
timeout 90 $B/kvlayer_decode_test > $R/decode-test.txt 2>&1; echo "exit $?" >> $R/decode-test.txt
echo "decode test at $((SECONDS - t0))" >> $R/times.txt
wait
A="python3 tools/bench-ab --unpack .devpack/gate/ab.tar.xz --rounds 2"
for spec in "131072 8x128x8 2" "16384 8x128x8 2" "4096 8x128x8 2" "1024 8x128x8 2" "131072 8x128x4 2" "16384 8x128x4 2" "131072 8x128x4 4" "131072 8x128x8 1" "131072 8x128x8 4"; do
  set -- $spec
  timeout 50 $A "--bench-args=--decode-only $1 --shape $2 --queries $3" > $R/ab-$1-$2-T$3.txt 2>&1
  echo "ab $spec at $((SECONDS - t0))" >> $R/times.txt
done
mkdir -p /tmp/k && tar xJf .devpack/gate/ab.tar.xz -C /tmp/k
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section LaunchStats --section Occupancy"
timeout 45 $NCU --clock-control none -k regex:decode_split_mma_direct --launch-skip 4 --launch-count 1 $S \
  /tmp/k/new bench --decode-only 131072 --queries 2 > $R/ncu-direct-verify-T2.txt 2>&1
echo "ncu 1 at $((SECONDS - t0))" >> $R/times.txt
timeout 45 $NCU --clock-control none -k regex:decode_split_mma_direct --launch-skip 4 --launch-count 1 $S \
  /tmp/k/new bench --decode-only 131072 > $R/ncu-direct-decode-T1.txt 2>&1
echo "ncu 2 at $((SECONDS - t0))" >> $R/times.txt
