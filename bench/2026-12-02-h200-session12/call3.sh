set -u
mkdir -p /tmp/x && python3 -c "import tarfile; tarfile.open('.devpack/ab.tar.xz').extractall('/tmp/x')"
xz -dc .devpack/dt.xz > /tmp/x/dt && chmod +x /tmp/x/dt
timeout 200 /tmp/x/dt --gtest_brief=1 > $OUT/decode_test_early.txt 2>&1; echo "decode_test rc=$?" >> $OUT/decode_test_early.txt
tail -3 $OUT/decode_test_early.txt
mkdir -p /tmp/abx; cp /tmp/x/ch /tmp/x/early /tmp/abx/; (cd /tmp/abx && tar cJf /tmp/ab2.tar.xz ch early)
python3 tools/bench-ab --unpack /tmp/ab2.tar.xz --rounds 3 > $OUT/ab.txt 2>&1
cat $OUT/ab.txt
for b in nc ch; do for s in 1x256x16 1x256x12; do for k in 1024 16384 131072; do
  echo "$b $s $(/tmp/x/$b bench --decode-only $k --shape $s --reps 30 | grep dc_graph)"
done; done; done > $OUT/hd256.txt 2>&1
cat $OUT/hd256.txt | awk '{print $1,$2,$6,$11}'
