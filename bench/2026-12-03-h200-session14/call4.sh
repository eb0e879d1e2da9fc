#!/usr/bin/env bash
# call 4: ncu kernel durations and L2/DRAM of the split and merge kernels, head (a95dd9f) vs
# map (b589d5e), 8x128 gqa 8 at 1K and 128K, 1x128 gqa 16 at 1K
mkdir -p /tmp/k && python3 -c "import tarfile; tarfile.open('.devpack/ab.tar.xz').extractall('/tmp/k')"
M=gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size
for b in head map; do
  for sk in 8x128x8:1024 8x128x8:131072 1x128x16:1024 4x256x8:1024; do
    shape=${sk%%:*}; keys=${sk##*:}
    echo "== $b $shape $keys"
    timeout 120 ncu -k regex:"decode_(split|merge)" --launch-skip 4 --launch-count 2 --metrics $M /tmp/k/$b bench --decode-only $keys --shape $shape 2>&1 | grep -E "decode_split|decode_merge|gpu__time|lts__t|dram__|sm__thr|grid_size" | sed 's/(SplitParams.*//' | head -14
  done
done
