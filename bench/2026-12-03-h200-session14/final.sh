#!/usr/bin/env bash
# Final validation on the device: unpack the carried builds, then device-check (every binary,
# sanitizers), the planted mutants and the campaign; results packed into $OUT/final.tgz.
cd "$(dirname "$0")/.."
python3 -c "import tarfile; [tarfile.open(f).extractall('.') for f in ('.devpack/dev.tar.xz', '.devpack/mut.tar.xz')]"
mkdir -p /tmp/fin
( OUT=/tmp/fin/dc KVLAYER_GPU_CASES=60 KVLAYER_TEST_TIMEOUT=150 KVLAYER_SANITIZE_TIMEOUT=120 \
    bash tools/device-check-remote.sh build-device "$PWD" > /tmp/fin/device-check.txt 2>&1; echo "rc $?" >> /tmp/fin/device-check.txt )
tail -30 /tmp/fin/device-check.txt
( OUT=/tmp/fin/mut JOBS=40 tools/mutants build-mutants 2 > /tmp/fin/mutants.txt 2>&1; echo "rc $?" >> /tmp/fin/mutants.txt )
tail -50 /tmp/fin/mutants.txt
( OUT=/tmp/fin/camp tools/device-campaign.sh build-device 12 1 > /tmp/fin/campaign.txt 2>&1; echo "rc $?" >> /tmp/fin/campaign.txt )
tail -20 /tmp/fin/campaign.txt
tar czf $OUT/final.tgz -C /tmp fin
