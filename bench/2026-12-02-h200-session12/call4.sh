set -u
python3 -c "import tarfile; tarfile.open('.devpack/val.tar.xz').extractall('.')"
R=$OUT; mkdir -p /tmp/dc
OUT=/tmp/dc KVLAYER_GPU_CASES=80 KVLAYER_TEST_TIMEOUT=200 KVLAYER_SANITIZE_TIMEOUT=150 timeout 540 bash tools/device-check-remote.sh build-device /work/main > /tmp/dc/stdout.txt 2>&1
echo "device-check rc=$?"
cp /tmp/dc/summary.txt $R/device-check-summary.txt 2>/dev/null
tar czf $R/dc-logs.tgz /tmp/dc 2>/dev/null
tail -70 /tmp/dc/summary.txt
