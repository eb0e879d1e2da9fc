#!/bin/bash
# Session 30, the gate in one call: device-check (fault tests first and alone, then every GPU
# suite, the long-view suite, examples, Python, compute-sanitizer) ∥, once the fault tests are
# done, the campaign (tools/device-campaign.sh, 8 processes × 3 minutes, its coverage floors)
# and the mutants planted in the wgmma verify (every mutant whose sites name
# decode_wgmma_verify, and the controls). Everything into $OUT/g.tar.xz.
set -u
t0=$SECONDS
R=$OUT/g; mkdir -p $R/tmp
trap 'echo "end at $((SECONDS - t0))" >> $R/times.txt; rm -rf $R/tmp/*/bin 2>/dev/null; tar -cJf $OUT/g.tar.xz -C $OUT g' EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
tar -xJf .devpack/gate/val.tar.xz && tar -xJf .devpack/gate/mut.tar.xz
cat .devpack/gate/COMMIT > $R/commit.txt
origin=$(cat .devpack/gate/ORIGIN)
(TMPDIR=$R/tmp OUT=$R/dc KVLAYER_SANITIZE_TIMEOUT=240 timeout 570 bash tools/device-check-remote.sh build-device "$origin" > $R/device-check.txt 2>&1; echo "exit $?" >> $R/device-check.txt; echo "dc at $((SECONDS - t0))" >> $R/times.txt) &
w=0; while [[ ! -e $R/dc/fault-tests.done ]] && ((w < 120)); do sleep 2; w=$((w + 2)); done
echo "fault tests done at $((SECONDS - t0))" >> $R/times.txt
(OUT=$R/campaign timeout 480 bash tools/device-campaign.sh build-device 8 3 > $R/campaign.txt 2>&1; echo "exit $?" >> $R/campaign.txt; echo "campaign at $((SECONDS - t0))" >> $R/times.txt) &
(MUTANTS_ONLY='^(decode_window_off_by_one|split_drops_last_key|decode_reads_past_view|wide_values_on_tensor_cores|k_folded_on_wide_block|k_fold_first_block_scale|pv_accumulated_in_f16|scale_folded_into_f16_q|verify_causal_off_by_one|verify_one_window|rescale_skipped_after_first_tile|verify_last_row_block_short|batch_neighbour_len_d|batch_first_base_d)$' MUTANT_RUNS='^(decode_wgmma_verify:d128|all:all)$' JOBS=4 OUT=$R/mutants timeout 470 tools/mutants build-mutants 1 > $R/mutants.txt 2>&1; echo "exit $?" >> $R/mutants.txt; echo "mut at $((SECONDS - t0))" >> $R/times.txt) &
wait
