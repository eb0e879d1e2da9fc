#!/usr/bin/env bash
# call 5: the final code (q̃ in registers in the bulk instance): device-check, mutants, campaign,
# then device-bench with the peers; everything into one tarball
cd "$(dirname "$0")/.."
python3 -c "import tarfile; tarfile.open('.devpack/val.tar.xz').extractall('.')"
R=/tmp/res; mkdir -p $R
t0=$SECONDS
OUT=/tmp/dc KVLAYER_GPU_CASES=60 KVLAYER_TEST_TIMEOUT=150 KVLAYER_SANITIZE_TIMEOUT=120 \
  bash tools/device-check-remote.sh build-device "$PWD" > $R/device-check.txt 2>&1
tail -32 $R/device-check.txt | head -40; grep -h "bound tightness" /tmp/dc/*.log > $R/tightness.txt
echo "== device-check $((SECONDS - t0)) s"; t0=$SECONDS
OUT=/tmp/mut JOBS=40 timeout 240 tools/mutants build-mutants 2 > $R/mutants.txt 2>&1
grep -E "NO|FALSE|unexpected" $R/mutants.txt; grep -c " yes " $R/mutants.txt
echo "== mutants $((SECONDS - t0)) s"; t0=$SECONDS
OUT=/tmp/camp timeout 150 tools/device-campaign.sh build-device 12 1 > $R/campaign.txt 2>&1
grep -E "failing|rows" $R/campaign.txt | tail -3
echo "== campaign $((SECONDS - t0)) s"; t0=$SECONDS
OUT=$R/bench timeout 280 bash tools/device-bench > $R/device-bench.txt 2>&1
tail -5 $R/device-bench.txt
echo "== bench $((SECONDS - t0)) s"
tar -C $R -czf $OUT/results.tar.gz .
