#!/bin/bash
# Session 30, call 1: kvlayer mma-probe; the wgmma verify's tests and two aimed fuzz runs; its
# timings against the mma.sync verify kernel (the same binary, KVLAYER_VERIFY_KERNEL=mma).
# Everything into $OUT/c1.tar.xz.
set -u
t0=$SECONDS
R=$OUT/c1; mkdir -p $R
trap 'echo "end at $((SECONDS - t0))" >> $R/times.txt; tar -cJf $OUT/c1.tar.xz -C $OUT c1' EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
mkdir -p /tmp/v && tar -xJf .devpack/s30/bin.tar.xz -C /tmp/v
B=/tmp/v/bin
timeout 60 $B/kvlayer mma-probe > $R/mma-probe.txt 2>&1; echo "exit $?" >> $R/mma-probe.txt
echo "probe at $((SECONDS - t0))" >> $R/times.txt
(timeout 100 $B/kvlayer fuzz --cases 1000000 --minutes 1.2 --seed 301 --head-dim 128 --replay-dir $R > $R/fuzz-a.txt 2>&1; echo "exit $?" >> $R/fuzz-a.txt) &
(timeout 100 $B/kvlayer fuzz --cases 1000000 --minutes 1.2 --seed 302 --head-dim 128 --min-gqa 4 --verify-kernel auto --longest 16384 --replay-dir $R > $R/fuzz-b.txt 2>&1; echo "exit $?" >> $R/fuzz-b.txt) &
timeout 80 $B/kvlayer_cuda_layer_tests --gtest_filter='*Verify*' > $R/layer-verify.txt 2>&1; echo "exit $?" >> $R/layer-verify.txt
echo "layer verify at $((SECONDS - t0))" >> $R/times.txt
timeout 80 $B/kvlayer_decode_test > $R/decode-test.txt 2>&1; echo "exit $?" >> $R/decode-test.txt
echo "decode test at $((SECONDS - t0))" >> $R/times.txt
wait
echo "fuzz at $((SECONDS - t0))" >> $R/times.txt
for spec in "131072 1 auto" "131072 4 auto" "131072 4 mma" "131072 8 auto" "131072 8 mma" "131072 16 auto" "131072 16 mma" "131072 32 auto" "131072 32 mma" "131072 64 auto" "16384 8 auto" "16384 8 mma" "16384 16 auto" "16384 16 mma"; do
  set -- $spec
  KVLAYER_VERIFY_KERNEL=$3 timeout 30 $B/kvlayer bench --decode-only $1 --queries $2 > $R/t-$1-T$2-$3.txt 2>&1
done
echo "timings at $((SECONDS - t0))" >> $R/times.txt
