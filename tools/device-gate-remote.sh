#!/usr/bin/env bash
# The landing gate's on-device half (run by the device tool in the repo root; tools/device-gate
# packs the builds here and prints the calls). A change to cuda/ lands only when, on its final
# code, the GPU suites, compute-sanitizer, the campaign and the mutants passed; device time comes
# in calls of at most 10 minutes, so the gate is cut into phases, each fitting one call, each
# stopping what it starts before BUDGET_S seconds and returning every log in ONE file,
# $OUT/logs.tar.xz (the device tool returns only a few files of $OUT):
#   check  tools/device-check-remote.sh ∥ tools/device-campaign.sh (CAMPAIGN_PROCS × CAMPAIGN_MIN
#          minutes, default 10 × 4) [∥ default_scale_f16 with DSF_CHECK=1], then `kvlayer
#          sensitivity --gpu` per head dim while time is left;
#   mut    tools/mutants (the full list, MJOBS at a time, default 13, 1 minute each) ∥
#          default_scale_f16 alone at 3.5 minutes (DSF=0: not), then tools/bench-ab (--verify,
#          one round) of the packed builds while time is left;
#   ab     tools/bench-ab alone;
#   all    check, mut and ab in one call (smaller campaign, mutants given more time each).
# Usage: bash tools/device-gate-remote.sh PHASE BUDGET_S   (environment: PACK, default
# .devpack/gate: val.tar.xz (build-device/bin), mut.tar.xz (build-mutants/bin/kvlayer),
# ab.tar.xz (tools/bench-ab --pack), COMMIT; AB_ROUNDS (default 1) and AB_ARGS, more bench-ab
# arguments such as --variant cc=new:KVLAYER_DECODE_KERNEL=cuda_core)
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
case $phase in
  check)
    (OUT=$L/dc KVLAYER_SANITIZE_TIMEOUT=240 timeout $(($(left) - 40)) \
      bash tools/device-check-remote.sh build-device "$origin" >"$L/device-check.txt" 2>&1
     echo "exit $?" >>"$L/device-check.txt") &
    (OUT=$L/campaign timeout $(($(left) - 40)) bash tools/device-campaign.sh build-device \
      "${CAMPAIGN_PROCS:-10}" "${CAMPAIGN_MIN:-4}" >"$L/campaign.txt" 2>&1
     echo "exit $?" >>"$L/campaign.txt") &
    if [[ ${DSF_CHECK:-0} == 1 ]]; then  # default_scale_f16 here, so that mut can be short
      tar -xJf "$D/mut.tar.xz"
      (JOBS=2 MUTANTS_ONLY='^default_scale_f16$' OUT=$L/dsf timeout $(($(left) - 40)) \
        tools/mutants build-mutants 3.5 >"$L/default-scale-f16.txt" 2>&1
       echo "exit $?" >>"$L/default-scale-f16.txt") &
    fi
    wait
    echo "check done at $(($(date +%s) - t0)) s" >>"$L/times.txt"
    if (($(left) > 90)); then
      for d in 128 256; do
        timeout $((($(left) - 20) / 2)) build-device/bin/kvlayer sensitivity --gpu --head-dim $d \
          >"$L/sensitivity-d$d.txt" 2>&1 &
      done
      wait
    fi
    ;;
  mut)
    tar -xJf "$D/mut.tar.xz"
    (JOBS=${MJOBS:-13} OUT=$L/mutants timeout $(($(left) - 100)) tools/mutants build-mutants 1 \
      >"$L/mutants.txt" 2>&1
     echo "exit $?" >>"$L/mutants.txt") &
    m1=$!
    m2=
    if [[ ${DSF:-1} == 1 ]]; then
      (JOBS=2 MUTANTS_ONLY='^default_scale_f16$' OUT=$L/dsf timeout $(($(left) - 100)) \
        tools/mutants build-mutants 3.5 >"$L/default-scale-f16.txt" 2>&1
       echo "exit $?" >>"$L/default-scale-f16.txt") &
      m2=$!
    fi
    wait $m1 $m2
    echo "mutants done at $(($(date +%s) - t0)) s" >>"$L/times.txt"
    if [[ -f $D/ab.tar.xz ]] && (($(left) > 60)); then
      timeout $(($(left) - 15)) python3 tools/bench-ab --unpack "$D/ab.tar.xz" --rounds "${AB_ROUNDS:-1}" \
        --verify --out "$L/bench-ab" ${AB_ARGS:-} >"$L/bench-ab.txt" 2>&1
    fi
    ;;
  all)
    # Every phase at once, for a session with device time for one call only: device-check ∥ a
    # smaller campaign (CAMPAIGN_PROCS default 6) ∥ the mutants (MJOBS default 12, MMIN minutes
    # each, default 1.5: the GPU is shared) ∥ default_scale_f16; then bench-ab while time is left.
    tar -xJf "$D/mut.tar.xz"
    (OUT=$L/dc KVLAYER_SANITIZE_TIMEOUT=240 timeout $(($(left) - 40)) \
      bash tools/device-check-remote.sh build-device "$origin" >"$L/device-check.txt" 2>&1
     echo "exit $?" >>"$L/device-check.txt") &
    (OUT=$L/campaign timeout $(($(left) - 40)) bash tools/device-campaign.sh build-device \
      "${CAMPAIGN_PROCS:-6}" "${CAMPAIGN_MIN:-4}" >"$L/campaign.txt" 2>&1
     echo "exit $?" >>"$L/campaign.txt") &
    (JOBS=${MJOBS:-12} OUT=$L/mutants timeout $(($(left) - 60)) tools/mutants build-mutants \
      "${MMIN:-1.5}" >"$L/mutants.txt" 2>&1
     echo "exit $?" >>"$L/mutants.txt") &
    (JOBS=2 MUTANTS_ONLY='^default_scale_f16$' OUT=$L/dsf timeout $(($(left) - 60)) \
      tools/mutants build-mutants 3.5 >"$L/default-scale-f16.txt" 2>&1
     echo "exit $?" >>"$L/default-scale-f16.txt") &
    wait
    echo "all done at $(($(date +%s) - t0)) s" >>"$L/times.txt"
    if [[ -f $D/ab.tar.xz ]] && (($(left) > 60)); then
      timeout $(($(left) - 15)) python3 tools/bench-ab --unpack "$D/ab.tar.xz" --rounds 1 \
        --verify --out "$L/bench-ab" ${AB_ARGS:-} >"$L/bench-ab.txt" 2>&1
    fi
    ;;
  ab)
    timeout $(($(left) - 10)) python3 tools/bench-ab --unpack "$D/ab.tar.xz" --rounds "${AB_ROUNDS:-1}" \
      --verify --out "$L/bench-ab" ${AB_ARGS:-} >"$L/bench-ab.txt" 2>&1
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
