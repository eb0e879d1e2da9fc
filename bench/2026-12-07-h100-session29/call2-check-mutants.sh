#!/bin/bash
# Session 29, call 2: device-check (its work dir kept under $OUT) ∥ the mutants that reach the new
# verify instances (decode_mma_direct at d128r8: the verify mutants there, the shared ones, host).
set -u
t0=$SECONDS
R=$OUT/g; mkdir -p $R/tmp
trap 'echo "end at $((SECONDS - t0))" >> $R/times.txt; rm -rf $R/tmp/*/bin 2>/dev/null; tar -cJf $OUT/g.tar.xz -C $OUT g' EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
tar -xJf .devpack/gate/val.tar.xz && tar -xJf .devpack/gate/mut.tar.xz
(TMPDIR=$R/tmp OUT=$R/dc KVLAYER_SANITIZE_TIMEOUT=240 timeout 540 bash tools/device-check-remote.sh build-device /work/main > $R/device-check.txt 2>&1; echo "exit $?" >> $R/device-check.txt; echo "dc at $((SECONDS - t0))" >> $R/times.txt) &
M='^(decode_window_off_by_one|split_drops_last_key|decode_reads_past_view|wide_values_on_tensor_cores|pv_accumulated_in_f16|scale_folded_into_f16_q|verify_causal_off_by_one|verify_one_window|rescale_skipped_after_first_tile|batch_neighbour_len_d|batch_first_base_d|verify_merge_granule)$'
(MUTANTS_ONLY="$M" MUTANT_RUNS='^(decode_mma_direct:d128r8|all:all)$' JOBS=5 OUT=$R timeout 420 tools/mutants build-mutants 1 > $R/mutants.txt 2>&1; echo "exit $?" >> $R/mutants.txt; echo "mut at $((SECONDS - t0))" >> $R/times.txt) &
wait
