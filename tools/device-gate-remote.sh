#!/usr/bin/env bash
# The landing gate's on-device half (run by the device tool in the repo root; tools/device-gate
# packs the builds here and prints the calls). A change to cuda/ lands only when, on its final
# code, the GPU suites, compute-sanitizer, the campaign and the mutants passed; device time comes
# in calls of at most 10 minutes, so the gate is cut into phases, each fitting one call, each
# stopping what it starts before BUDGET_S seconds and returning every log in ONE file,
# $OUT/logs.tar.xz (the device tool returns only a few files of $OUT):
#   check  tools/device-check-remote.sh (with its resolution sweeps) ∥ tools/device-campaign.sh
#          (CAMPAIGN_PROCS × CAMPAIGN_MIN minutes, default 10 × 4) [∥ default_scale_f16 with
#          DSF_CHECK=1];
#   mut    tools/mutants (the full list, MJOBS at a time, default 13, 1 minute each) ∥
#          default_scale_f16 alone at 3.5 minutes (DSF=0: not), then the mutants whose runs timed
#          out, alone, then tools/bench-ab (--verify, one round) of the packed builds while time
#          is left;
#   ab     tools/bench-ab alone;
#   all    check, mut and ab in one call (smaller campaign, mutants given more time each, the
#          timed-out ones again alone).
# Usage: bash tools/device-gate-remote.sh PHASE BUDGET_S   (environment: PACK, default
# .devpack/gate: val.tar.xz (build-device/bin), mut.tar.xz (build-mutants/bin/kvlayer),
# ab.tar.xz (tools/bench-ab --pack), COMMIT; AB_ROUNDS (default 1), AB_VERIFY (default 1: the
# verify rows too) and AB_ARGS, more bench-ab arguments such as --variant
# cc=new:KVLAYER_DECODE_KERNEL=cuda_core; AB_BENCH_ARGS, kvlayer bench arguments for every run;
# MUT_MARGIN, the seconds mut keeps for bench-ab)
set -u
phase=${1:?phase: check, mut, ab or all}
budget=${2:?budget in seconds}
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
D=${PACK:-.devpack/gate}
out=${OUT:-$PWD/device-gate-out}
L=$out/logs
mkdir -p "$L"
finish() {
  echo "end at $(($(date +%s) - t0)) s" >>"$L/times.txt"
  tar -cJf "$out/logs.tar.xz" -C "$out" logs && rm -rf "$L"
}
trap finish EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv >"$L/gpu.txt" 2>&1
cat "$D/COMMIT" >"$L/commit.txt" 2>/dev/null
# The binaries were built in the checkout at origin (their source paths point there).
origin=$(cat "$D/ORIGIN" 2>/dev/null || echo "$PWD")
[[ $phase == ab ]] || tar -xJf "$D/val.tar.xz"
[[ $phase == mut || $phase == all || ${DSF_CHECK:-0} == 1 ]] && tar -xJf "$D/mut.tar.xz"

# The jobs, each stopping MARGIN seconds before the budget and ending its log with its exit.
# GPU work beside device_check starts once its fault tests, which must run alone, are done.
after_fault_tests() {  # at most 120 s
  local waited=0
  while [[ ! -e $L/dc/fault-tests.done ]] && ((waited < 120)); do
    sleep 2
    waited=$((waited + 2))
  done
}
device_check() {  # MARGIN
  (OUT=$L/dc KVLAYER_SANITIZE_TIMEOUT=240 timeout $(($(left) - $1)) \
    bash tools/device-check-remote.sh build-device "$origin" >"$L/device-check.txt" 2>&1
   echo "exit $?" >>"$L/device-check.txt")
}
campaign() {  # MARGIN PROCESSES
  (OUT=$L/campaign timeout $(($(left) - $1)) bash tools/device-campaign.sh build-device "$2" \
    "${CAMPAIGN_MIN:-4}" >"$L/campaign.txt" 2>&1
   echo "exit $?" >>"$L/campaign.txt")
}
mutant_list() {  # MARGIN JOBS MINUTES
  (JOBS=$2 OUT=$L/mutants timeout $(($(left) - $1)) tools/mutants build-mutants "$3" \
    >"$L/mutants.txt" 2>&1
   echo "exit $?" >>"$L/mutants.txt")
}
default_scale_f16() {  # MARGIN: the mutant that needs minutes of cases, on its own
  (JOBS=2 MUTANTS_ONLY='^default_scale_f16$' OUT=$L/dsf timeout $(($(left) - $1)) \
    tools/mutants build-mutants 3.5 >"$L/default-scale-f16.txt" 2>&1
   echo "exit $?" >>"$L/default-scale-f16.txt")
}
retry_timeouts() {  # MARGIN: the mutants whose runs hit their time limit (rc 124: no verdict,
  # mostly from sharing the GPU), again alone with the time that is left
  local names
  names=$(cat "$L/mutants.txt" "$L/default-scale-f16.txt" 2>/dev/null |
    awk '/CRASH\(rc=124\)/ {print $1}' | sort -u | paste -sd'|')
  [[ -n $names ]] || return 0
  local minutes=$(( ($(left) - $1) / 60 ))
  ((minutes >= 2)) || { echo "no time to retry: $names" >>"$L/times.txt"; return 0; }
  (JOBS=16 MUTANTS_ONLY="^($names)\$" OUT=$L/retry timeout $(($(left) - $1)) \
    tools/mutants build-mutants $((minutes - 1)) >"$L/mutants-retry.txt" 2>&1
   echo "exit $?" >>"$L/mutants-retry.txt")
}
bench_ab() {  # MARGIN
  [[ -f $D/ab.tar.xz ]] || return 0
  timeout $(($(left) - $1)) python3 tools/bench-ab --unpack "$D/ab.tar.xz" \
    --rounds "${AB_ROUNDS:-1}" $([[ ${AB_VERIFY:-1} == 1 ]] && echo --verify) --out "$L/bench-ab" \
    --bench-args "${AB_BENCH_ARGS:-}" ${AB_ARGS:-} >"$L/bench-ab.txt" 2>&1
}
case $phase in
  check)
    device_check 40 &
    after_fault_tests
    campaign 40 "${CAMPAIGN_PROCS:-10}" &
    # default_scale_f16 here with DSF_CHECK=1, so that mut can be short
    [[ ${DSF_CHECK:-0} == 1 ]] && default_scale_f16 40 &
    wait
    echo "check done at $(($(date +%s) - t0)) s" >>"$L/times.txt"
    ;;
  mut)
    mutant_list "${MUT_MARGIN:-100}" "${MJOBS:-13}" 1 &
    [[ ${DSF:-1} == 1 ]] && default_scale_f16 "${MUT_MARGIN:-100}" &
    wait
    echo "mutants done at $(($(date +%s) - t0)) s" >>"$L/times.txt"
    retry_timeouts 60
    (($(left) > 60)) && bench_ab 15
    ;;
  all)
    # Every phase at once, for a session with device time for one call only: a smaller campaign,
    # the mutants given more minutes each (the GPU is shared); then bench-ab while time is left.
    device_check 40 &
    after_fault_tests
    campaign 40 "${CAMPAIGN_PROCS:-6}" &
    mutant_list 60 "${MJOBS:-12}" "${MMIN:-1.5}" &
    default_scale_f16 60 &
    wait
    echo "all done at $(($(date +%s) - t0)) s" >>"$L/times.txt"
    retry_timeouts 60
    (($(left) > 60)) && bench_ab 15
    ;;
  ab)
    bench_ab 10
    ;;
  *)
    echo "device-gate-remote: unknown phase $phase (check, mut, ab, all)" >&2
    exit 2
    ;;
esac
for f in "$L"/*.txt; do
  echo "== ${f##*/}"
  tail -n 25 "$f"
done
