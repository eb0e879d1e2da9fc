set -u
python3 -c "import tarfile; tarfile.open('.devpack/val.tar.xz').extractall('.')"
mkdir -p /tmp/mr
for s in 1 2 3 4 5 6 7 8; do
  KVLAYER_MUTANT=default_scale_f16 timeout 230 build-mutants/bin/kvlayer fuzz --cases 1000000 --minutes 3 --seed $s --replay-dir /tmp/mr > /tmp/mr/seed$s.log 2>/tmp/mr/seed$s.err &
done
wait
for s in 1 2 3 4 5 6 7 8; do echo "seed $s: $(grep -E '^ *(cases|failures|shrunk sequence|seconds) ' /tmp/mr/seed$s.log | tr -s ' ' | tr '\n' ';') $(tail -c 300 /tmp/mr/seed$s.err | tr '\n' ' ')"; done > $OUT/default_scale_rerun.txt
cp /tmp/mr/seed1.log $OUT/seed1.log
cat $OUT/default_scale_rerun.txt
