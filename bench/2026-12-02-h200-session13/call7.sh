#!/usr/bin/env bash
# call 7 (final binary 3e12f08): kvlayer probe on the shared bulk_copy.cuh wrappers (smoke), then
# for the next session: gqa > 8 at head dim 256, rows whole (staged 16-row kernel) vs split (two
# 8-row blocks of the bulk instance)
cd "$(dirname "$0")/.."
python3 -c "import tarfile; tarfile.open('.devpack/k.tar.xz').extractall('.')"
K=build-device/bin/kvlayer
echo "== probe"
timeout 60 $K probe --keys 16384 --reps 5 > $OUT/probe.txt 2>&1; echo "rc $?" >> $OUT/probe.txt; tail -14 $OUT/probe.txt
for shape in 4x256x16 1x256x16; do
  for keys in 16384 131072; do
    for rows in whole split; do
      r=$(KVLAYER_DECODE_ROWS=$rows timeout 30 $K bench --decode-only $keys --shape $shape 2>&1 | grep "_graph" | head -1)
      echo "$shape $keys $rows | $r"
    done
  done
done | tee $OUT/rows.txt
