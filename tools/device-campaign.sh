#!/usr/bin/env bash
# On the GPU machine: the model-based campaign in parallel (one `kvlayer fuzz` process per
# seed, all sharing the GPU), then a table of cases, cases per minute and failures, and each
# process's "bound tightness:" line. A process that ran the reference alone (no GPU) counts as
# failing: it compared nothing with the CUDA layer.
#   tools/device-campaign.sh BUILD_DIR PROCESSES MINUTES [FIRST_SEED]
# Failing cases' replay files and each process's summary land in $OUT (or ./campaign-out).
set -uo pipefail
build=${1:-build-device}
procs=${2:-16}
minutes=${3:-5}
first_seed=${4:-1000}
out=${OUT:-$PWD/campaign-out}
mkdir -p "$out/campaign"
start=$(date +%s)
for ((i = 0; i < procs; ++i)); do
  seed=$((first_seed + i))
  "$build/bin/kvlayer" fuzz --cases 1000000 --minutes "$minutes" --seed "$seed" \
    --replay-dir "$out/campaign" >"$out/campaign/fuzz-$seed.log" 2>/dev/null &
done
wait
secs=$(($(date +%s) - start))
total=0
failed=0
printf '%-8s %8s %10s %9s %12s %s\n' seed cases cases/min failures bytes "worst error/bound"
for f in "$out"/campaign/fuzz-*.log; do
  seed=${f##*/fuzz-}
  seed=${seed%.log}
  cases=$(awk '$1 == "cases" && NF == 2 {print $2}' "$f")
  rate=$(awk '$1 == "cases" && $2 == "per" {print $4}' "$f")
  fails=$(awk '$1 == "failures" {print $2}' "$f")
  bytes=$(awk '$1 == "bytes" && $2 == "compared" {print $3}' "$f")
  worst=$(awk -F'  +' '/largest decode error\/bound/ {print $3}' "$f")
  printf '%-8s %8s %10s %9s %12s %s\n' "$seed" "${cases:-?}" "${rate:-?}" "${fails:-?}" "${bytes:-?}" "${worst:-?}"
  total=$((total + ${cases:-0}))
  sides=$(awk -F'  +' '$2 == "sides" {print $3}' "$f")
  if [[ "${fails:-1}" != 0 || "$sides" != "reference + CUDA" ]]; then failed=$((failed + 1)); fi
done
echo
echo "bound tightness (by seed):"
for f in "$out"/campaign/fuzz-*.log; do
  seed=${f##*/fuzz-}
  seed=${seed%.log}
  grep -aE '^bound tightness:' "$f" | sed "s|^|  seed $seed: |" || echo "  seed $seed: (none printed)"
done
echo "campaign: $procs processes x $minutes min: $total cases in $secs s" \
     "($((total * 60 / (secs > 0 ? secs : 1))) cases/min overall), failing processes: $failed"
grep -h "sides" "$out"/campaign/fuzz-*.log | sort | uniq -c
[[ $failed == 0 ]]
