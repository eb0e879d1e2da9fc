set -u
python3 -c "import tarfile; tarfile.open('.devpack/val.tar.xz').extractall('.')"
R=$OUT; mkdir -p /tmp/mut /tmp/camp
( OUT=/tmp/mut JOBS=20 timeout 300 tools/mutants build-mutants 1 > $R/mutants.txt 2>&1; echo "mutants rc=$?" >> $R/mutants.txt ) &
( OUT=/tmp/camp timeout 200 tools/device-campaign.sh build-device 12 1 > $R/campaign.txt 2>&1; echo "campaign rc=$?" >> $R/campaign.txt ) &
wait
tar czf $R/mut-logs.tgz /tmp/mut/mutants/*.log /tmp/mut/mutants/*.err /tmp/camp 2>/dev/null
cat $R/mutants.txt | head -60
tail -25 $R/campaign.txt
