#include "kvlayer/harness/hang_watchdog.hpp"

#include <cstdio>
#include <cstdlib>

namespace kvlayer::harness {

HangWatchdog::HangWatchdog(double limit_seconds, OnHang on_hang)
    : limit_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(limit_seconds))),
      on_hang_(std::move(on_hang)),
      thread_([this] { watch(); }) {}

HangWatchdog::~HangWatchdog() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_one();
  thread_.join();
}

HangWatchdog::Call::Call(HangWatchdog* watchdog) : watchdog_(watchdog) {
  if (watchdog_ == nullptr) return;
  {
    const std::lock_guard<std::mutex> lock(watchdog_->mutex_);
    watchdog_->in_call_ = true;
    watchdog_->call_start_ = Clock::now();
  }
  watchdog_->changed_.notify_one();
}

HangWatchdog::Call::~Call() {
  if (watchdog_ == nullptr) return;
  {
    // Blocks while on_hang runs: the call that returned too late does not race the report.
    const std::lock_guard<std::mutex> lock(watchdog_->mutex_);
    watchdog_->in_call_ = false;
  }
  watchdog_->changed_.notify_one();
}

void HangWatchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (!in_call_) {
      changed_.wait(lock);
      continue;
    }
    const Clock::time_point start = call_start_;
    changed_.wait_until(lock, start + limit_);
    if (stopping_ || !in_call_ || call_start_ != start || Clock::now() < start + limit_) continue;
    if (on_hang_) on_hang_(std::chrono::duration<double>(Clock::now() - start).count());
    std::fflush(nullptr);
    // No destructors, no atexit handlers: they would synchronize with the hung device.
    std::_Exit(1);
  }
}

}  // namespace kvlayer::harness
