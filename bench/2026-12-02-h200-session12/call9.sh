set -u
( KVLAYER_GPU_CASES=60 timeout 150 build-device/bin/test_model_cuda > $OUT/test_model_cuda.txt 2>&1; echo "test_model_cuda rc=$?" >> $OUT/test_model_cuda.txt ) &
( OUT=/tmp/camp timeout 150 tools/device-campaign.sh build-device 12 1 > $OUT/campaign.txt 2>&1; echo "campaign rc=$?" >> $OUT/campaign.txt ) &
wait
tail -6 $OUT/test_model_cuda.txt
tail -32 $OUT/campaign.txt
