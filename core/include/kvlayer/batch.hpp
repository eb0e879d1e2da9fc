// A batch's active list (SPEC §12): its one validity rule, shared by the reference batch and
// the CUDA batch, so that both refuse the same lists with the same message.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "kvlayer/error.hpp"

namespace kvlayer {

/// Refuses, as operation `op`, a list longer than max_batch, an entry outside [0, max_batch) or
/// a repeated entry, naming it; an empty list is legal.
inline void check_active_list(const char* op, std::span<const int> sequences, int max_batch) {
  if (std::ptrdiff_t(sequences.size()) > max_batch)
    refuse(op, "the list has ", sequences.size(), " sequences, more than max_batch ", max_batch);
  std::vector<int> position(std::size_t(max_batch), -1);
  for (std::size_t p = 0; p < sequences.size(); ++p) {
    const int i = sequences[p];
    if (i < 0 || i >= max_batch)
      refuse(op, "entry ", p, " is sequence ", i, ", outside [0, max_batch ", max_batch, ")");
    if (position[std::size_t(i)] >= 0)
      refuse(op, "sequence ", i, " appears twice (entries ", position[std::size_t(i)], " and ", p,
             ")");
    position[std::size_t(i)] = int(p);
  }
}

}  // namespace kvlayer
