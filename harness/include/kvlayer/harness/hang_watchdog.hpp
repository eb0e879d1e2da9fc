// A system call that does not return is a failure the harness must report, not wait out: a
// deadlocked kernel (a barrier waited on at the wrong phase, a spin on a flag nobody sets)
// blocks the host at the next synchronizing call for ever, so the case can neither fail nor
// shrink and the process ends only by an outer timeout, with nothing saved. The watchdog
// watches one call at a time; once a call has run past the limit it hands the hang to on_hang
// (which saves and prints what it can) and then ends the process with exit status 1: a hung
// device cannot be taken back from inside it, so nothing after the hang can run.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace kvlayer::harness {

/// How long one system call may run before the campaign reports a hang: the slowest call a
/// case makes (a 128K-key verify chain's capture and replays, a snapshot of a long layer)
/// takes well under a second on the device, so a minute is never a slow call.
inline constexpr double kDefaultHangSeconds = 60;

class HangWatchdog {
 public:
  /// Called on the watchdog's thread with the seconds the call has run; the process exits
  /// with status 1 when it returns. The watched thread is blocked inside the call meanwhile.
  using OnHang = std::function<void(double seconds)>;

  /// limit_seconds > 0.
  HangWatchdog(double limit_seconds, OnHang on_hang);
  ~HangWatchdog();
  HangWatchdog(const HangWatchdog&) = delete;
  HangWatchdog& operator=(const HangWatchdog&) = delete;

  /// A call in flight from its construction to its destruction (one at a time).
  class Call {
   public:
    explicit Call(HangWatchdog* watchdog);
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    HangWatchdog* watchdog_;
  };

 private:
  void watch();

  using Clock = std::chrono::steady_clock;
  const Clock::duration limit_;
  const OnHang on_hang_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool in_call_ = false;
  bool stopping_ = false;
  Clock::time_point call_start_{};
  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace kvlayer::harness
