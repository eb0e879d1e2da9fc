#!/usr/bin/env bash
# call 2: carveout fix; tensor-map boxes; failures under bulk; variants; ncu of the bulk kernels
cd "$(dirname "$0")/.."
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devpack/bins.tar.xz && B=/tmp/b
mkdir -p /tmp/k && tar -C /tmp/k -xJf .devpack/ab.tar.xz
for v in 1 0; do
echo "== decode tests, bulk, tmap $v"
KVLAYER_BULK_TMAP=$v KVLAYER_DECODE_LOADS=bulk timeout 120 $B/kvlayer_decode_test --gtest_brief=1 2>&1 | grep -v "^model\|worst" | tail -30
done
echo "== A/B"
timeout 300 python3 tools/bench-ab --unpack .devpack/ab.tar.xz --rounds 2 --variant bulk=new:KVLAYER_DECODE_LOADS=bulk \
  --variant bulk1d=new:KVLAYER_DECODE_LOADS=bulk,KVLAYER_BULK_TMAP=0 --variant bulk2=new:KVLAYER_DECODE_LOADS=bulk,KVLAYER_BULK_STAGES=2 2>&1 | tee $OUT/ab.txt
echo "== ncu"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for shape in 8x128x8 4x256x8; do
  KVLAYER_DECODE_LOADS=bulk timeout 100 $NCU --kernel-name regex:decode_split --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    /tmp/k/new bench --decode-only 131072 --shape $shape > $OUT/ncu-bulk-$shape.txt 2>&1
  grep -E "Duration|Achieved Occupancy|Theoretical Occupancy|Block Limit|DRAM Throughput|Memory Throughput|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Issued Ipc|Stall|Bank|One or More" $OUT/ncu-bulk-$shape.txt | head -30
done
