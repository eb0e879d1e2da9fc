#!/usr/bin/env bash
# call 3: the final code (bulk head dim 256): device-check, mutants, campaign, A/B against HEAD
cd "$(dirname "$0")/.."
python3 -c "import tarfile; tarfile.open('.devpack/val.tar.xz').extractall('.')"
t0=$SECONDS
OUT=/tmp/dc KVLAYER_GPU_CASES=60 KVLAYER_TEST_TIMEOUT=150 KVLAYER_SANITIZE_TIMEOUT=120 \
  bash tools/device-check-remote.sh build-device "$PWD" > $OUT/device-check.txt 2>&1
tail -30 $OUT/device-check.txt; grep -h "bound tightness" /tmp/dc/*.log | head -12 > $OUT/tightness.txt; cat $OUT/tightness.txt
echo "== device-check $((SECONDS - t0)) s"; t0=$SECONDS
OUT=/tmp/mut JOBS=40 timeout 240 tools/mutants build-mutants 2 > $OUT/mutants.txt 2>&1
tail -45 $OUT/mutants.txt
echo "== mutants $((SECONDS - t0)) s"; t0=$SECONDS
OUT=/tmp/camp timeout 150 tools/device-campaign.sh build-device 12 1 > $OUT/campaign.txt 2>&1
tail -22 $OUT/campaign.txt
echo "== campaign $((SECONDS - t0)) s"; t0=$SECONDS
timeout 120 python3 tools/bench-ab --unpack .devpack/ab.tar.xz --rounds 2 > $OUT/ab.txt 2>&1; cat $OUT/ab.txt
echo "== A/B $((SECONDS - t0)) s"
