#!/usr/bin/env bash
# call 4: head dim 256 bulk variants: q̃ in registers, L2 256B promotion on the tensor maps
cd "$(dirname "$0")/.."
timeout 200 python3 tools/bench-ab --unpack .devpack/ab.tar.xz --rounds 3 2>&1 | tee $OUT/ab.txt | grep -E "row|4x256"
