set -u
bash tools/device-bench > /tmp/devbench.txt 2>&1; echo "device-bench rc=$?"
tail -5 /tmp/devbench.txt
python3 -c "import tarfile; tarfile.open('.devpack/val.tar.xz').extractall('.')"
mkdir -p /tmp/mr
for s in 1 2 3 4 5 6; do
  KVLAYER_MUTANT=default_scale_f16 timeout 200 build-mutants/bin/kvlayer fuzz --cases 1000000 --minutes 2.5 --seed $s --replay-dir /tmp/mr > /tmp/mr/seed$s.log 2>&1 &
done
wait
for s in 1 2 3 4 5 6; do echo "seed $s: $(grep -E '^(cases|failures|shrunk sequence|seconds) ' /tmp/mr/seed$s.log | tr '\n' ' ')"; done > $OUT/default_scale_rerun.txt
cat $OUT/default_scale_rerun.txt
