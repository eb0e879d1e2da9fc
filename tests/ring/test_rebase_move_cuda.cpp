// The rebase move's overlap-safety argument, checked on the host (no GPU needed): the per-class
// work of the kernel (move_class) run class by class in a shuffled order — any interleaving of
// whole classes, which is what disjoint classes allow — equals memmove for every shift/keep
// combination a ring can produce, and leaves the bytes past keep alone.
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_testbed.hpp"
#include "rebase.hpp"

namespace kvlayer::testing {
namespace {

using cuda::detail::move_class;
using cuda::detail::move_classes;
using cuda::detail::PlaneMove;

TEST(RebaseMoveHost, AnyClassOrderEqualsMemmove) {
  std::mt19937_64 gen(0x5EED);
  // Token sizes of K (34·blocks) and V (24·blocks); shifts are multiples of 32 rows.
  for (std::int64_t tok : {34, 68, 24, 48, 34 * 6, 24 * 6, 34 * 8, 24 * 16}) {
    for (std::int64_t shift_rows : {32, 64, 96, 160}) {
      for (std::int64_t keep_rows : {0, 1, 2, 31, 32, 33, 63, 64, 65, 100, 161, 300}) {
        const std::int64_t rows = shift_rows + keep_rows + 3;
        std::vector<std::uint8_t> plane(std::size_t(rows * tok) + 256);
        for (auto& b : plane) b = std::uint8_t(gen());
        std::vector<std::uint8_t> want = plane;
        std::memmove(want.data(), want.data() + shift_rows * tok, std::size_t(keep_rows * tok));
        // 16-byte alignment as cudaMalloc gives: place the plane in an aligned copy.
        std::vector<uint4> storage(plane.size() / 16 + 1);
        auto* p = reinterpret_cast<std::uint8_t*>(storage.data());
        std::memcpy(p, plane.data(), plane.size());
        const PlaneMove m{p, shift_rows * tok, keep_rows * tok};
        std::vector<std::int64_t> order(std::size_t(move_classes(m)));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), gen);
        for (std::int64_t r : order) move_class(m, r);
        ASSERT_EQ(std::memcmp(p, want.data(), want.size()), 0)
            << "tok " << tok << " shift " << shift_rows << " keep " << keep_rows;
      }
    }
  }
}

}  // namespace
}  // namespace kvlayer::testing
