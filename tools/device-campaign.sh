#!/usr/bin/env bash
# On the GPU machine: the model-based campaign in parallel (one `kvlayer fuzz` process per
# seed), spread round-robin over every visible GPU (process i gets CUDA_VISIBLE_DEVICES set to
# the (i mod G)-th of them), then a table of cases, cases per minute and failures per seed, the
# same per GPU and in total, and each process's "bound tightness:" line. A process that ran the
# reference alone (no GPU) counts as failing: it compared nothing with the CUDA layer.
#   tools/device-campaign.sh BUILD_DIR PROCESSES MINUTES [FIRST_SEED]
# The GPUs: CUDA_VISIBLE_DEVICES' entries when it is set, else nvidia-smi's indices; when none
# are found the processes inherit the environment unchanged (gpu "-" in the tables).
# Failing cases' replay files and each process's summary land in $OUT (or ./campaign-out), and
# all of them in $OUT/campaign-logs.tar.gz. A process stops drawing cases after MINUTES; the
# case in flight finishes (a 128K-key case can take a minute or two): allow MINUTES + 3.
# Each case draws its decode plan (row choice, split balance, verify split cap, kernel family),
# so every process reaches every kernel instance; some processes aim at the rarer families by
# their default (aims below, the "aim" column). After the tables, the coverage of all
# processes summed (SPEC §10.7): the campaign fails when a selectable instance did not run 1, 2
# and >= 3 key-loop trips, or a merge over 256 splits, a verify of T > 16, a ring view past base
# over several splits or a multi-unit rebase never happened.
set -uo pipefail
build=${1:-build-device}
procs=${2:-16}
minutes=${3:-5}
first_seed=${4:-1000}
out=${OUT:-$PWD/campaign-out}
mkdir -p "$out/campaign"
gpus=()
if [[ -n ${CUDA_VISIBLE_DEVICES+set} ]]; then
  IFS=',' read -ra gpus <<<"${CUDA_VISIBLE_DEVICES//[[:space:]]/}"
elif command -v nvidia-smi >/dev/null 2>&1; then
  mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -d ' ')
fi
declare -A gpu_of  # seed -> the GPU its process saw ("-": the environment unchanged)
# Aims: process i adds aims[i mod 8]'s fuzz flags ("-": none), which each case records (its
# replay file draws the same case). The CUDA-core family is drawn in one case of six otherwise,
# too rarely for its 15 instances (3 head dims x 5 row counts) to reach every trip floor: half
# the processes aim at it, one head dim each (and one at gqa 2..8), with views of at most 16K
# keys (its floors are reached at short and medium views, and those cases are fast). The
# 16-row tensor-core instances need whole-row plans with gqa > 8: one process in eight.
aims=(- "--kernel cuda_core --head-dim 64 --longest 16384" - \
      "--kernel cuda_core --head-dim 128 --longest 16384" "--rows whole --min-gqa 9" \
      "--kernel cuda_core --head-dim 256 --longest 16384" - \
      "--kernel cuda_core --min-gqa 2 --max-gqa 8 --longest 16384")
declare -A aim_of
start=$(date +%s)
logs=()  # this campaign's (an earlier one's logs in $OUT stay out of the tables)
for ((i = 0; i < procs; ++i)); do
  seed=$((first_seed + i))
  logs+=("$out/campaign/fuzz-$seed.log")
  aim_of[$seed]=${aims[i % ${#aims[@]}]}
  aim_flags=()
  [[ ${aim_of[$seed]} == - ]] || read -ra aim_flags <<<"${aim_of[$seed]}"
  if ((${#gpus[@]} > 0)); then
    gpu_of[$seed]=${gpus[i % ${#gpus[@]}]}
    env CUDA_VISIBLE_DEVICES="${gpu_of[$seed]}" "$build/bin/kvlayer" fuzz --cases 1000000 \
      --minutes "$minutes" --seed "$seed" --replay-dir "$out/campaign" "${aim_flags[@]}" \
      >"$out/campaign/fuzz-$seed.log" 2>/dev/null &
  else
    gpu_of[$seed]=-
    "$build/bin/kvlayer" fuzz --cases 1000000 --minutes "$minutes" --seed "$seed" \
      --replay-dir "$out/campaign" "${aim_flags[@]}" >"$out/campaign/fuzz-$seed.log" 2>/dev/null &
  fi
done
wait
secs=$(($(date +%s) - start))
per_min() { echo $(($1 * 60 / (secs > 0 ? secs : 1))); }
total=0
failed=0
declare -A gpu_procs gpu_cases gpu_failed
printf '%-8s %4s %-32s %8s %10s %9s %12s %s\n' seed gpu aim cases cases/min failures bytes \
  "worst error/bound"
for f in "${logs[@]}"; do
  seed=${f##*/fuzz-}
  seed=${seed%.log}
  gpu=${gpu_of[$seed]:--}
  cases=$(awk '$1 == "cases" && NF == 2 {print $2}' "$f")
  rate=$(awk '$1 == "cases" && $2 == "per" {print $4}' "$f")
  fails=$(awk '$1 == "failures" {print $2}' "$f")
  bytes=$(awk '$1 == "bytes" && $2 == "compared" {print $3}' "$f")
  worst=$(awk -F'  +' '/largest decode error\/bound/ {print $3}' "$f")
  printf '%-8s %4s %-32s %8s %10s %9s %12s %s\n' "$seed" "$gpu" "${aim_of[$seed]}" "${cases:-?}" \
    "${rate:-?}" "${fails:-?}" "${bytes:-?}" "${worst:-?}"
  total=$((total + ${cases:-0}))
  gpu_procs[$gpu]=$((${gpu_procs[$gpu]:-0} + 1))
  gpu_cases[$gpu]=$((${gpu_cases[$gpu]:-0} + ${cases:-0}))
  sides=$(awk -F'  +' '$2 == "sides" {print $3}' "$f")
  if [[ "${fails:-1}" != 0 || "$sides" != "reference + CUDA" ]]; then
    failed=$((failed + 1))
    gpu_failed[$gpu]=$((${gpu_failed[$gpu]:-0} + 1))
  fi
done
echo
echo "per GPU (cases/min over the campaign's $secs s):"
printf '%-6s %9s %10s %10s %9s\n' gpu processes cases cases/min failing
for gpu in $(printf '%s\n' "${!gpu_procs[@]}" | sort -n); do
  printf '%-6s %9s %10s %10s %9s\n' "$gpu" "${gpu_procs[$gpu]}" "${gpu_cases[$gpu]}" \
    "$(per_min "${gpu_cases[$gpu]}")" "${gpu_failed[$gpu]:-0}"
done
printf '%-6s %9s %10s %10s %9s\n' total "$procs" "$total" "$(per_min "$total")" "$failed"
echo
echo "bound tightness (by seed):"
for f in "${logs[@]}"; do
  seed=${f##*/fuzz-}
  seed=${seed%.log}
  grep -aE '^(bound tightness|systematic check)' "$f" | sed "s|^|  seed $seed: |" || echo "  seed $seed: (none printed)"
done
echo "campaign: $procs processes x $minutes min on ${#gpus[@]} GPU(s)${gpus[*]:+ (${gpus[*]})}:" \
     "$total cases in $secs s ($(per_min "$total") cases/min overall), failing processes: $failed"
grep -h "sides" "${logs[@]}" | sort | uniq -c
echo
python3 "$(dirname "$0")/campaign_coverage.py" "${logs[@]}"
coverage=$?
# Every process's log and replay file in one archive: a device call returns only the first few
# files of a folder.
tar -czf "$out/campaign-logs.tar.gz" -C "$out" campaign && echo "logs: $out/campaign-logs.tar.gz"
[[ $failed == 0 && $coverage == 0 ]]
