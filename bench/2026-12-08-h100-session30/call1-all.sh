#!/bin/bash
# Session 30, one call for everything (device time was short): kvlayer mma-probe; timings of the
# wgmma verify against the mma.sync verify (the same binary, KVLAYER_VERIFY_KERNEL=mma) on the
# idle GPU; then the gate: device-check (fault tests first and alone, every GPU suite, the
# long-view suite, examples, Python, compute-sanitizer) ∥, once the fault tests are done, the
# campaign (8 processes × 3 minutes, its coverage floors), two campaigns aimed at the wgmma
# verify (opt-in: --verify-kernel wgmma) and the mutants planted in it (and the controls).
# Everything into $OUT/a.tar.xz; all stops by 585 s.
set -u
t0=$SECONDS
left() { echo $((585 - (SECONDS - t0))); }
R=$OUT/a; mkdir -p $R/tmp
trap 'echo "end at $((SECONDS - t0))" >> $R/times.txt; rm -rf $R/tmp/*/bin 2>/dev/null; tar -cJf $OUT/a.tar.xz -C $OUT a' EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
tar -xJf .devpack/gate/val.tar.xz && tar -xJf .devpack/gate/mut.tar.xz
cat .devpack/gate/COMMIT > $R/commit.txt
origin=$(cat .devpack/gate/ORIGIN)
B=build-device/bin
timeout 30 $B/kvlayer mma-probe > $R/mma-probe.txt 2>&1; echo "exit $?" >> $R/mma-probe.txt
echo "probe at $((SECONDS - t0))" >> $R/times.txt
for spec in "131072 1 wgmma" "131072 8 wgmma" "131072 8 mma" "131072 4 wgmma" "131072 4 mma" "131072 16 wgmma" "131072 16 mma" "131072 32 wgmma" "131072 32 mma" "16384 8 wgmma" "16384 8 mma"; do
  set -- $spec
  KVLAYER_VERIFY_KERNEL=$3 timeout 20 $B/kvlayer bench --decode-only $1 --queries $2 > $R/t-$1-T$2-$3.txt 2>&1
done
echo "timings at $((SECONDS - t0))" >> $R/times.txt
(TMPDIR=$R/tmp OUT=$R/dc KVLAYER_SANITIZE_TIMEOUT=200 timeout $(left) bash tools/device-check-remote.sh build-device "$origin" > $R/device-check.txt 2>&1; echo "exit $?" >> $R/device-check.txt; echo "dc at $((SECONDS - t0))" >> $R/times.txt) &
w=0; while [[ ! -e $R/dc/fault-tests.done ]] && ((w < 120)); do sleep 2; w=$((w + 2)); done
echo "fault tests done at $((SECONDS - t0))" >> $R/times.txt
(OUT=$R/campaign timeout $(($(left) - 5)) bash tools/device-campaign.sh build-device 8 3 > $R/campaign.txt 2>&1; echo "exit $?" >> $R/campaign.txt; echo "campaign at $((SECONDS - t0))" >> $R/times.txt) &
for seed in 3011 3012; do
  (timeout $(($(left) - 5)) $B/kvlayer fuzz --cases 1000000 --minutes 3 --seed $seed --head-dim 128 --verify-kernel wgmma --replay-dir $R > $R/fuzz-wgmma-$seed.txt 2>&1; echo "exit $?" >> $R/fuzz-wgmma-$seed.txt) &
done
(MUTANTS_ONLY='^(decode_window_off_by_one|split_drops_last_key|decode_reads_past_view|wide_values_on_tensor_cores|k_folded_on_wide_block|k_fold_first_block_scale|pv_accumulated_in_f16|scale_folded_into_f16_q|verify_causal_off_by_one|verify_one_window|rescale_skipped_after_first_tile|verify_last_row_block_short|batch_neighbour_len_d|batch_first_base_d)$' MUTANT_RUNS='^(decode_wgmma_verify:d128|all:all)$' JOBS=4 OUT=$R/mutants timeout $(($(left) - 5)) tools/mutants build-mutants 1 > $R/mutants.txt 2>&1; echo "exit $?" >> $R/mutants.txt; echo "mut at $((SECONDS - t0))" >> $R/times.txt) &
wait
