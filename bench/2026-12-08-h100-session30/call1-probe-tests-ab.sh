#!/bin/bash
# Session 30, call 1: kvlayer mma-probe; the wgmma verify's tests and two aimed fuzz runs; its
# timings against the mma.sync verify kernel (the same binary, KVLAYER_VERIFY_KERNEL=mma); ncu of
# the wgmma kernel at T = 8 and 16. Everything into $OUT/c1.tar.xz.
set -u
t0=$SECONDS
R=$OUT/c1; mkdir -p $R
trap 'echo "end at $((SECONDS - t0))" >> $R/times.txt; tar -cJf $OUT/c1.tar.xz -C $OUT c1' EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
mkdir -p /tmp/v && tar -xJf .devpack/s30/bin.tar.xz -C /tmp/v
B=/tmp/v/bin
timeout 60 $B/kvlayer mma-probe > $R/mma-probe.txt 2>&1; echo "exit $?" >> $R/mma-probe.txt
echo "probe at $((SECONDS - t0))" >> $R/times.txt
(timeout 120 $B/kvlayer fuzz --cases 1000000 --minutes 1.7 --seed 301 --head-dim 128 --verify-kernel auto --replay-dir $R > $R/fuzz-a.txt 2>&1; echo "exit $?" >> $R/fuzz-a.txt) &
(timeout 120 $B/kvlayer fuzz --cases 1000000 --minutes 1.7 --seed 302 --head-dim 128 --min-gqa 4 --verify-kernel auto --longest 16384 --replay-dir $R > $R/fuzz-b.txt 2>&1; echo "exit $?" >> $R/fuzz-b.txt) &
timeout 100 $B/kvlayer_cuda_layer_tests --gtest_filter='*Verify*' > $R/layer-verify.txt 2>&1; echo "exit $?" >> $R/layer-verify.txt
echo "layer verify at $((SECONDS - t0))" >> $R/times.txt
timeout 100 $B/kvlayer_decode_test > $R/decode-test.txt 2>&1; echo "exit $?" >> $R/decode-test.txt
echo "decode test at $((SECONDS - t0))" >> $R/times.txt
wait
echo "fuzz at $((SECONDS - t0))" >> $R/times.txt
for keys in 131072 16384; do
  for T in 1 4 8 16 32 64; do
    for k in auto mma; do
      [[ $T == 1 && $k == mma ]] && continue
      KVLAYER_VERIFY_KERNEL=$k timeout 30 $B/kvlayer bench --decode-only $keys --queries $T > $R/t-$keys-T$T-$k.txt 2>&1
    done
  done
  echo "timings $keys at $((SECONDS - t0))" >> $R/times.txt
done
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis"
for T in 8 16; do
  timeout 50 $NCU --clock-control none -k regex:decode_split_wgmma_verify --launch-skip 4 --launch-count 1 $S \
    $B/kvlayer bench --decode-only 131072 --queries $T > $R/ncu-wgmma-T$T.txt 2>&1
  echo "ncu T$T at $((SECONDS - t0))" >> $R/times.txt
done
