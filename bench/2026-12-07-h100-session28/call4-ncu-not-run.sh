#!/bin/bash
# Session 28, call 4: ncu of D3's 16-row direct verify (T = 2) and the 8-row decode (T = 1), 128K, 8x128 gqa 8.
set -u
R=$OUT/n; mkdir -p $R
trap 'tar -cJf $OUT/n.tar.xz -C $OUT n' EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
mkdir -p /tmp/k && tar xJf .devpack/gate/ab.tar.xz -C /tmp/k
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section LaunchStats --section Occupancy --section ComputeWorkloadAnalysis"
timeout 60 $NCU --clock-control none -k regex:decode_split_mma_direct --launch-skip 4 --launch-count 1 $S \
  /tmp/k/new bench --decode-only 131072 --queries 2 > $R/ncu-direct-verify-T2.txt 2>&1
timeout 60 $NCU --clock-control none -k regex:decode_split_mma_direct --launch-skip 4 --launch-count 1 $S \
  /tmp/k/new bench --decode-only 131072 > $R/ncu-direct-decode-T1.txt 2>&1
timeout 60 $NCU --clock-control none -k regex:decode_split_mma_verify --launch-skip 4 --launch-count 1 $S \
  /tmp/k/base bench --decode-only 131072 --queries 2 > $R/ncu-verify-base-T2.txt 2>&1
