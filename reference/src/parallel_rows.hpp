// Runs independent rows of a verify decode, of its bound, or the KV heads of one decode, on the
// machine's cores: each is the same float64 code as before and writes its own outputs, so every
// value is bit-identical to the serial computation; only the wall-clock time changes (the long
// views of SPEC §10.7 made the serial loops the bottleneck of the campaign and the GPU tests).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace kvlayer::ref::detail {

/// Whether this thread already runs a row of parallel_rows (nested calls then run serially, so
/// that rows × KV heads never start more threads than the machine has cores).
inline thread_local bool in_parallel_rows = false;

/// f(i) for every i in [0, n), on up to hardware_concurrency threads; rethrows the first
/// exception any row threw (after every thread has stopped).
template <typename F>
void parallel_rows(std::size_t n, F&& f) {
  const std::size_t workers =
      in_parallel_rows
          ? 1
          : std::min<std::size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (workers <= 1) {
    for (std::size_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<std::size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    const bool outer = in_parallel_rows;
    in_parallel_rows = true;
    for (std::size_t i = next++; i < n; i = next++) {
      try {
        f(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = n;  // stop handing out rows
      }
    }
    in_parallel_rows = outer;
  };
  std::vector<std::thread> threads;
  for (std::size_t w = 1; w < workers; ++w) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace kvlayer::ref::detail
