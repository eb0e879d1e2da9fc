#!/usr/bin/env bash
# call 1: bulk kernel correctness (decode suite under KVLAYER_DECODE_LOADS=bulk) + A/B
cd "$(dirname "$0")/.."
mkdir -p /tmp/b && tar -C /tmp/b -xJf .devpack/bins.tar.xz && B=/tmp/b
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
echo "== decode tests, bulk"
KVLAYER_DECODE_LOADS=bulk timeout 150 $B/kvlayer_decode_test --gtest_brief=1 2>&1 | tail -25
echo "== decode tests, direct"
timeout 100 $B/kvlayer_decode_test --gtest_brief=1 2>&1 | tail -6
echo "== model, bulk"
KVLAYER_DECODE_LOADS=bulk KVLAYER_GPU_CASES=40 timeout 100 $B/test_model_cuda --gtest_brief=1 2>&1 | tail -8
echo "== A/B"
timeout 200 python3 tools/bench-ab --unpack .devpack/ab.tar.xz --rounds 2 --variant bulk=new:KVLAYER_DECODE_LOADS=bulk --out $OUT/ab 2>&1 | tee $OUT/ab.txt
