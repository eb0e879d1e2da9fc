// Input element types accepted by appends: f32, f16 and bf16 (SPEC §3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvlayer {

/// Element type of K/V rows handed to an append.
enum class DType : std::uint8_t { f32, f16, bf16 };

/// Bytes per element of `t`.
constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

/// Lower-case name of `t` ("f32", "f16", "bf16").
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

}  // namespace kvlayer
