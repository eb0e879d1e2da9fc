#!/bin/bash
# Session 29, call 4: the fault tests alone (call 2 ran them beside the mutants, whose processes
# moved the free device memory they watch), and campaign seed 1006, which call 3's 330 s limit cut
# (its seven siblings passed), with three more seeds beside it; stderr kept.
set -u
t0=$SECONDS
R=$OUT/s; mkdir -p $R/replay
trap 'echo "end at $((SECONDS - t0))" >> $R/times.txt; tar -cJf $OUT/s.tar.xz -C $OUT s' EXIT
tar -xJf .devpack/gate/val.tar.xz
B=build-device/bin
timeout 60 $B/kvlayer_cuda_fault_tests > $R/fault-tests.txt 2>&1; echo "exit $?" >> $R/fault-tests.txt
echo "fault tests at $((SECONDS - t0))" >> $R/times.txt
run() {  # SEED FLAGS...
  local s=$1; shift
  (timeout 400 $B/kvlayer fuzz --cases 1000000 --minutes 4 --seed $s --replay-dir $R/replay "$@" > $R/fuzz-$s.log 2> $R/fuzz-$s.err; echo "exit $?" >> $R/fuzz-$s.log; echo "seed $s at $((SECONDS - t0))" >> $R/times.txt) &
}
run 1006
run 1008
run 1009 --rows whole --min-gqa 9
run 1010 --head-dim 128 --max-gqa 8
wait
