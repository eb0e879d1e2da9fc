set -u
python3 -c "import tarfile; tarfile.open('.devpack/val.tar.xz').extractall('.')"
R=$OUT; mkdir -p /tmp/dc /tmp/mut /tmp/camp
OUT=/tmp/dc KVLAYER_GPU_CASES=60 KVLAYER_TEST_TIMEOUT=150 KVLAYER_SANITIZE_TIMEOUT=120 timeout 150 bash tools/device-check-remote.sh build-device /work/main > /tmp/dc/stdout.txt 2>&1
echo "device-check rc=$?"
cp /tmp/dc/summary.txt $R/device-check-summary.txt 2>/dev/null
grep -E "^total|FAIL|vacuous|ANoThrow" /tmp/dc/summary.txt | head -20
grep -h "ANoThrowGuard" -A1 /tmp/dc/logs/*multi_gpu* 2>/dev/null | head -4
OUT=/tmp/mut JOBS=40 timeout 140 tools/mutants build-mutants 1 > $R/mutants.txt 2>&1; echo "mutants rc=$?" >> $R/mutants.txt
grep -cE " yes " $R/mutants.txt; grep -E " NO |FALSE|none |rc=" $R/mutants.txt
