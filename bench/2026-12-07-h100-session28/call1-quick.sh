#!/bin/bash
# Session 28, call 1: the direct verify's tests and timings before the gate. Everything into $OUT/q.tar.xz.
set -u
t0=$SECONDS
R=$OUT/q; mkdir -p $R
trap 'echo "end at $((SECONDS - t0))" >> $R/times.txt; tar -cJf $OUT/q.tar.xz -C $OUT q' EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
mkdir -p /tmp/v && tar -xJf .devpack/gate/val.tar.xz -C /tmp/v
B=/tmp/v/build-device/bin
(timeout 110 $B/kvlayer fuzz --cases 1000000 --minutes 1.5 --seed 28 --head-dim 128 --max-gqa 8 --replay-dir $R > $R/fuzz-a.txt 2>&1; echo "exit $?" >> $R/fuzz-a.txt) &
(timeout 110 $B/kvlayer fuzz --cases 1000000 --minutes 1.5 --seed 29 --head-dim 128 --max-gqa 4 --longest 16384 --replay-dir $R > $R/fuzz-b.txt 2>&1; echo "exit $?" >> $R/fuzz-b.txt) &
timeout 100 $B/kvlayer_cuda_layer_tests --gtest_filter='*Verify*' > $R/layer-verify.txt 2>&1; echo "exit $?" >> $R/layer-verify.txt
echo "layer verify at $((SECONDS - t0))" >> $R/times.txt
timeout 90 $B/kvlayer_decode_test > $R/decode-test.txt 2>&1; echo "exit $?" >> $R/decode-test.txt
echo "decode test at $((SECONDS - t0))" >> $R/times.txt
wait
A="python3 tools/bench-ab --unpack .devpack/gate/ab.tar.xz --rounds 2"
for spec in "131072 8x128x8 2" "16384 8x128x8 2" "4096 8x128x8 2" "1024 8x128x8 2" "131072 8x128x8 1" "131072 8x128x8 4"; do
  set -- $spec
  timeout 50 $A "--bench-args=--decode-only $1 --shape $2 --queries $3" > $R/ab-$1-$2-T$3.txt 2>&1
  echo "ab $spec at $((SECONDS - t0))" >> $R/times.txt
done
