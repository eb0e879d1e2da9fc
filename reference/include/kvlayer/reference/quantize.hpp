// The reference q8_0 / q5_1 block quantizers and dequantizers (SPEC §2–4), one block at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "kvlayer/geometry.hpp"

namespace kvlayer::ref {

/// Quantizes 32 values into one q8_0 block (34 bytes). Returns the offending value when the
/// block cannot be represented; the bytes are then the canonical bad block (SPEC §3).
std::optional<float> quantize_q8_0_block(std::span<const float, kBlockValues> x,
                                         std::span<std::uint8_t, kQ8_0BlockBytes> out);

/// Quantizes 32 values into one q5_1 block (24 bytes); bad blocks as for q8_0.
std::optional<float> quantize_q5_1_block(std::span<const float, kBlockValues> x,
                                         std::span<std::uint8_t, kQ5_1BlockBytes> out);

/// Dequantizes one q8_0 block: x_j = f32(d)·q_j.
void dequantize_q8_0_block(std::span<const std::uint8_t, kQ8_0BlockBytes> in,
                           std::span<float, kBlockValues> out);

/// Dequantizes one q5_1 block: x_j = f32(d)·q_j + f32(m).
void dequantize_q5_1_block(std::span<const std::uint8_t, kQ5_1BlockBytes> in,
                           std::span<float, kBlockValues> out);

/// A q5_1 block's minimum m as f32 (its fp16 field, SPEC §2).
float q5_1_block_min(std::span<const std::uint8_t, kQ5_1BlockBytes> in);

/// The values the tensor-core kernels multiply for one q5_1 block (kvlayer/accuracy.hpp (3)):
/// each exact d·q + m rounded once to fp16 (RNE; one fused multiply-add).
void dequantize_q5_1_block_fused_f16(std::span<const std::uint8_t, kQ5_1BlockBytes> in,
                                     std::span<double, kBlockValues> out);

/// The K values a kernel with a fused shape multiplies for one q8_0 block (kvlayer/accuracy.hpp
/// (1)): each exact d·q rounded once to fp16 (RNE, subnormals kept).
void dequantize_q8_0_block_folded_f16(std::span<const std::uint8_t, kQ8_0BlockBytes> in,
                                      std::span<double, kBlockValues> out);

/// True when a q8_0 block's d keeps its key tile out of the fold (|d| > 511.75, or not finite;
/// the kernels' k_header_maybe_wide).
bool q8_0_header_may_be_wide(std::span<const std::uint8_t, kQ8_0BlockBytes> in);

/// True when a q5_1 header may send some kernel to its f32 path for the block's key tile
/// (|d| > 1024 or |m| > 32768, or a non-finite d or m; the kernels' v_header_maybe_wide).
bool q5_1_header_may_be_wide(std::span<const std::uint8_t, kQ5_1BlockBytes> in);

/// x rounded to the nearest fp16 value (ties to even; ±inf beyond fp16's range).
double round_to_f16(double x);

/// Block-type tag used by the row helpers and the CLI.
enum class BlockType : std::uint8_t { q8_0, q5_1 };

/// Bytes per block of `t`.
constexpr int block_bytes(BlockType t) { return t == BlockType::q8_0 ? kQ8_0BlockBytes : kQ5_1BlockBytes; }

/// A bad block found by quantize_row: its index in the row and the offending value.
struct BadBlock {
  std::int64_t block;
  float value;
};

/// Quantizes x (a multiple of 32 values) into consecutive blocks of type t. Returns the first
/// bad block, if any (all blocks are written regardless).
std::optional<BadBlock> quantize_row(BlockType t, std::span<const float> x,
                                     std::span<std::uint8_t> out);

/// Dequantizes consecutive blocks of type t into out (32 values per block).
void dequantize_row(BlockType t, std::span<const std::uint8_t> in, std::span<float> out);

}  // namespace kvlayer::ref
