// Quantized append: K rows -> q8_0 blocks, V rows -> q5_1 blocks, bit-exact with
// reference/src/quantize.cpp (SPEC §3). One thread per 32-value block, quantized in registers
// (quantize_block.cuh); consecutive threads take consecutive blocks (all K blocks of the rows,
// then all V blocks), so a warp reads and writes contiguous bytes. A warp whose 32 blocks lie in
// one aligned buffer (a staged window) copies them into shared memory with coalesced cp.async
// while it quantizes the previous window, and stores its quantized bytes as one contiguous run;
// other windows load each block as 16-byte vectors, or element-wise, and store it in place.
//
// NOTE: a thread per block, not a warp per block: a warp's shuffle reductions cost ~240 issue
// slots per block, which makes the kernel issue-bound far below the streaming rate
// (bench/NOTES.md).
//
// NOTE: exactness rests on IEEE arithmetic with explicit rounding intrinsics and on this
// target's -fmad=false --prec-div=true --ftz=false (cuda/CMakeLists.txt); never fast-math.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "append_kernel.hpp"
#include "cp_async.cuh"
#include "kvlayer/geometry.hpp"
#include "kvlayer/status.hpp"
#include "quantize_block.cuh"

namespace kvlayer::cuda::detail {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
/// Resident blocks per multiprocessor the grid is sized for (__launch_bounds__ caps the
/// registers to fit them).
constexpr int kBlocksPerSm = 4;

constexpr int kPlaneK = 0;
constexpr int kPlaneV = 1;

/// One 16-bit input element (f16 or bf16 bits) converted exactly to f32.
template <DType T>
__device__ inline float widen(unsigned short h) {
  if constexpr (T == DType::f16) {
    // NOTE: Inf/NaN by hand: the reported bad value must keep a NaN's payload bit for bit, as
    // the reference's conversion does; the hardware conversion need not.
    if ((h & 0x7C00u) == 0x7C00u)
      return __uint_as_float((unsigned(h & 0x8000u) << 16) | 0x7F800000u |
                             (unsigned(h & 0x3FFu) << 13));
    return __half2float(__ushort_as_half(h));
  } else {
    return __uint_as_float(unsigned(h) << 16);
  }
}

/// Bytes of one input block (32 elements of T), and its 16-byte pieces.
template <DType T>
inline constexpr int kInBlockBytes = T == DType::f32 ? 128 : 64;
template <DType T>
inline constexpr int kPieces = kInBlockBytes<T> / 16;

/// The values of a block held in its 16-byte piece k (f32: 4k..4k+3; f16/bf16: 8k..8k+7,
/// widened exactly).
template <DType T>
__device__ __forceinline__ void unpack_piece(const uint4& v, int k, float (&x)[32]) {
  if constexpr (T == DType::f32) {
    x[4 * k] = __uint_as_float(v.x);
    x[4 * k + 1] = __uint_as_float(v.y);
    x[4 * k + 2] = __uint_as_float(v.z);
    x[4 * k + 3] = __uint_as_float(v.w);
  } else {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[8 * k + 2 * j] = widen<T>(static_cast<unsigned short>(u[j] & 0xFFFFu));
      x[8 * k + 2 * j + 1] = widen<T>(static_cast<unsigned short>(u[j] >> 16));
    }
  }
}

/// The 32 values of the block starting at element `first` of a row buffer, as f32.
/// `vectors`: the buffer is 16-byte aligned (a block is then 128 or 64 aligned bytes).
template <DType T>
__device__ inline void load_block(const void* p, long long first, bool vectors, float (&x)[32]) {
  if constexpr (T == DType::f32) {
    const float* f = static_cast<const float*>(p) + first;
    if (vectors) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float4 v = reinterpret_cast<const float4*>(f)[i];
        x[4 * i] = v.x;
        x[4 * i + 1] = v.y;
        x[4 * i + 2] = v.z;
        x[4 * i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) x[j] = f[j];
    }
  } else {
    const unsigned short* h = static_cast<const unsigned short*>(p) + first;
    if (vectors) {
#pragma unroll
      for (int k = 0; k < kPieces<T>; ++k)
        unpack_piece<T>(reinterpret_cast<const uint4*>(h)[k], k, x);
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) x[j] = widen<T>(h[j]);
    }
  }
}

/// A warp's stage: its window's 32 input blocks, pieces XOR-swizzled (piece k of block b at
/// b·P + (k ^ (b mod P))) so that the coalesced fills and the per-lane reads are both free of
/// bank conflicts.
template <DType T>
struct Stage {
  uint4 piece[32 * kPieces<T>];
};

/// Blocks [first, first + 32) of the append, as the kernel's warps walk them (all K blocks of
/// the rows, then all V blocks). `staged`: the 32 blocks are all K (or all V) blocks of a
/// 16-byte aligned buffer, so the warp copies them into its stage with coalesced 16-byte loads
/// (piece k·32 + lane of the window at step k) and stores them back through it (store_run);
/// other windows are loaded and stored lane by lane.
struct Window {
  long long first;
  bool staged;
  const uint4* src;  ///< the window's first piece (staged windows)
};

template <DType T>
__device__ __forceinline__ Window window_at(const AppendArgs& a, long long first,
                                            long long k_blocks, long long total, bool k_vectors,
                                            bool v_vectors) {
  Window w{first, false, nullptr};
  if (k_vectors && first + 32 <= k_blocks) {
    w.staged = true;
    w.src = static_cast<const uint4*>(a.k) + first * kPieces<T>;
  } else if (v_vectors && first >= k_blocks && first + 32 <= total) {
    w.staged = true;
    w.src = static_cast<const uint4*>(a.v) + (first - k_blocks) * kPieces<T>;
  }
  return w;
}

/// Starts the copy of a staged window into `stage` (one cp.async group per call, empty for
/// other windows, so that the group count stays uniform).
template <DType T>
__device__ __forceinline__ void issue_window(const Window& w, bool valid, int lane,
                                             Stage<T>& stage) {
  constexpr int P = kPieces<T>;
  if (valid && w.staged) {
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const int piece = k * 32 + lane, b = piece / P, sub = piece % P;
      cp_async<16>(&stage.piece[b * P + (sub ^ (b % P))], w.src + piece);
    }
  }
  cp_async_commit();
}

/// Lane `lane`'s block from a filled stage, as f32.
template <DType T>
__device__ __forceinline__ void read_stage(const Stage<T>& stage, int lane, float (&x)[32]) {
  constexpr int P = kPieces<T>;
  uint4 w[P];
#pragma unroll
  for (int k = 0; k < P; ++k) w[k] = stage.piece[lane * P + (k ^ (lane % P))];
#pragma unroll
  for (int k = 0; k < P; ++k) unpack_piece<T>(w[k], k, x);
}

/// Stores `bytes` (a multiple of 8) from the stage to dst with the warp's lanes writing
/// consecutive words: 8-byte words where dst allows, else 4-byte (a K run starts 4-byte aligned
/// for the layer's head dims: k_tok_bytes is a multiple of 68), else 2-byte (odd blocks per row,
/// kept for other callers of launch_append).
/// NOTE: each lane storing its own 34-byte block as 16-bit words sent 17 scattered store
/// instructions per warp, ~3 useful bytes per 32-byte sector (ncu).
__device__ __forceinline__ void store_run(const std::uint8_t* stage, std::uint8_t* dst, int bytes,
                                          int lane) {
  const auto address = reinterpret_cast<std::uintptr_t>(dst);
  if (address % 8 == 0) {
    for (int w = lane; w < bytes / 8; w += 32)
      reinterpret_cast<unsigned long long*>(dst)[w] =
          reinterpret_cast<const unsigned long long*>(stage)[w];
  } else if (address % 4 == 0) {
    for (int w = lane; w < bytes / 4; w += 32)
      reinterpret_cast<unsigned*>(dst)[w] = reinterpret_cast<const unsigned*>(stage)[w];
  } else {
    for (int w = lane; w < bytes / 2; w += 32)
      reinterpret_cast<unsigned short*>(dst)[w] = reinterpret_cast<const unsigned short*>(stage)[w];
  }
}

/// Each warp walks windows of 32 blocks (one block per lane) with a grid stride; the next
/// window's copy is in flight while the current one is quantized (two stages per warp).
/// NOTE: the stores are staged too: a lane storing its own block issues 17 scattered 16-bit
/// stores per K block, which bounds the kernel whatever the loads do (bench/NOTES.md).
/// A batch append's block row y = position j: the arguments of one layer's append of the
/// position's n rows to its sequence; false past the active list.
template <DType T>
__device__ __forceinline__ bool position_args(AppendArgs& a) {
  const int j = int(blockIdx.y);
  if (j >= *a.batch.n_active) return false;
  int sequence = a.batch.active[j];
  if (KVLAYER_DEVICE_MUTANT(batch_append_next_slot) && a.max_batch > 1) {
    sequence = (sequence + 1) % a.max_batch;  // planted bug: the next sequence's write slot
    if (blockIdx.x == 0 && threadIdx.x == 0) KVLAYER_MUTANT_REACHED(MutantSite::append);
  }
  const SequenceSlot s = a.batch.slots[sequence];
  a.k_plane = s.k_plane;
  a.v_plane = s.v_plane;
  a.len_d = s.len_d;
  a.base_d = s.base_d;
  a.status = s.status;
  const long long elements = (long long)j * a.n;  // rows before the position's
  a.k = static_cast<const char*>(a.k) + elements * a.kv_dim_k * (T == DType::f32 ? 4 : 2);
  a.v = static_cast<const char*>(a.v) + elements * a.kv_dim_v * (T == DType::f32 ? 4 : 2);
  return true;
}

template <DType T, AppendMode M, bool kBatch>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) append_kernel(AppendArgs a) {
  __shared__ Stage<T> stages_s[kWarps][2];
  if constexpr (kBatch) {
    if (!position_args<T>(a)) return;
  }
  const int lane = int(threadIdx.x & 31u), warp = int(threadIdx.x >> 5);
  long long physical0 = a.physical_row0;
  long long logical0 = a.logical_row0;
  if constexpr (M == AppendMode::host) {
    // The new length: nothing in this launch reads it (host mode takes its row by value).
    if (a.host_len_d_out != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
      *a.host_len_d_out = static_cast<std::int32_t>(logical0 + a.n);
  } else {
    // Device-counter rows len_d … len_d + n − 1 (SPEC §7, §11), checked in the reference's
    // order: max_ctx first; any row out of bounds writes none.
    const long long len = *a.len_d;
    const long long base = M == AppendMode::dcw ? *a.base_d : 0;
    int kind = 0;
    long long limit = 0;
    if (len + a.n > a.max_ctx) {
      kind = int(DeviceErrorKind::append_past_max_ctx);
      limit = a.max_ctx;
    } else if (M == AppendMode::dcw && (len - base < 0 || len - base + a.n > a.rows)) {
      kind = int(DeviceErrorKind::append_outside_rows);
      limit = a.rows;
    }
    if (kind != 0) {
      if (blockIdx.x == 0 && threadIdx.x == 0)
        record_device_error(a.status, kind, len, base, limit);
      return;  // writes nothing
    }
    physical0 = len - base;
    logical0 = len;
    if (KVLAYER_DEVICE_MUTANT(rows_append_wrong_slot) && a.n > 1 && physical0 + a.n < a.rows) {
      ++physical0;  // planted bug: one slot late
      if (blockIdx.x == 0 && threadIdx.x == 0) KVLAYER_MUTANT_REACHED(MutantSite::append);
    }
  }
  const long long kb = a.kv_dim_k / kBlockValues;
  const long long vb = a.kv_dim_v / kBlockValues;
  const long long k_blocks = a.n * kb;
  const long long total = k_blocks + a.n * vb;
  const bool k_vectors = (reinterpret_cast<std::uintptr_t>(a.k) & 15u) == 0;
  const bool v_vectors = (reinterpret_cast<std::uintptr_t>(a.v) & 15u) == 0;
  // NOTE: windows are warp-uniform, so whole warps iterate together and the ballot below is
  // legal; lane `lane` takes block first + lane.
  const long long stride = static_cast<long long>(gridDim.x) * kThreads;
  long long first = static_cast<long long>(blockIdx.x) * kThreads + 32 * warp;
  Window cur = window_at<T>(a, first, k_blocks, total, k_vectors, v_vectors);
  issue_window<T>(cur, first < total, lane, stages_s[warp][0]);
  for (int slot = 0; first < total; first += stride, slot ^= 1) {
    const Window next = window_at<T>(a, first + stride, k_blocks, total, k_vectors, v_vectors);
    issue_window<T>(next, first + stride < total, lane, stages_s[warp][slot ^ 1]);
    cp_async_wait<1>();  // this lane's copies of `cur`
    __syncwarp();        // … and every lane's

    const long long i = first + lane;
    bool bad = false;
    float bad_value = 0.0f;
    long long row = 0, block = 0;
    int plane = kPlaneK;
    if (cur.staged) {
      // All 32 blocks in one plane: quantized into the stage, then stored as one contiguous
      // run of bytes (a plane's blocks follow each other across heads and rows).
      std::uint8_t* out = reinterpret_cast<std::uint8_t*>(stages_s[warp][slot].piece);
      float x[32];
      read_stage<T>(stages_s[warp][slot], lane, x);
      __syncwarp();  // every lane has its input before the stage takes the output
      std::uint8_t* dst;
      int block_bytes;
      if (i < k_blocks) {
        row = i / kb;
        block = i % kb;
        block_bytes = kQ8_0BlockBytes;
        bad = quantize_q8_0_block(x, out + block_bytes * lane, &bad_value);
        dst = a.k_plane + physical0 * a.k_tok_bytes + first * kQ8_0BlockBytes;
      } else {
        row = (i - k_blocks) / vb;
        block = (i - k_blocks) % vb;
        plane = kPlaneV;
        block_bytes = kQ5_1BlockBytes;
        bad = quantize_q5_1_block(x, out + block_bytes * lane, &bad_value);
        dst = a.v_plane + physical0 * a.v_tok_bytes + (first - k_blocks) * kQ5_1BlockBytes;
      }
      __syncwarp();
      store_run(out, dst, 32 * block_bytes, lane);
    } else if (i < total) {
      float x[32];
      if (i < k_blocks) {
        row = i / kb;
        block = i % kb;
        load_block<T>(a.k, row * a.kv_dim_k + block * kBlockValues, k_vectors, x);
        bad = quantize_q8_0_block(
            x, a.k_plane + (physical0 + row) * a.k_tok_bytes + block * kQ8_0BlockBytes, &bad_value);
      } else {
        row = (i - k_blocks) / vb;
        block = (i - k_blocks) % vb;
        plane = kPlaneV;
        load_block<T>(a.v, row * a.kv_dim_v + block * kBlockValues, v_vectors, x);
        bad = quantize_q5_1_block(
            x, a.v_plane + (physical0 + row) * a.v_tok_bytes + block * kQ5_1BlockBytes, &bad_value);
      }
    }
    // Bad blocks are recorded one lane at a time (the record takes a global lock).
    for (unsigned m = __ballot_sync(0xFFFFFFFFu, bad); m != 0; m &= m - 1)
      if (lane == __ffs(static_cast<int>(m)) - 1)
        record_data_error(a.status, logical0 + row, plane, block, bad_value);
    __syncwarp();  // every lane has read this stage before the next iteration refills it
    cur = next;
  }
  cp_async_wait<0>();  // only empty groups can remain; keep the exit clean anyway
}

template <DType T>
cudaError_t launch_typed(const AppendArgs& a, AppendMode mode, dim3 grid, cudaStream_t s) {
  const bool batch = a.batch.slots != nullptr;
  switch (mode) {
    case AppendMode::host:
      if (batch) return cudaErrorInvalidValue;  // a batch appends at its device counters
      append_kernel<T, AppendMode::host, false><<<grid, kThreads, 0, s>>>(a);
      break;
    case AppendMode::dc:
      if (batch)
        append_kernel<T, AppendMode::dc, true><<<grid, kThreads, 0, s>>>(a);
      else
        append_kernel<T, AppendMode::dc, false><<<grid, kThreads, 0, s>>>(a);
      break;
    case AppendMode::dcw:
      if (batch)
        append_kernel<T, AppendMode::dcw, true><<<grid, kThreads, 0, s>>>(a);
      else
        append_kernel<T, AppendMode::dcw, false><<<grid, kThreads, 0, s>>>(a);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_append(const AppendArgs& a, AppendMode mode, cudaStream_t stream) {
  const long long blocks = a.n * (a.kv_dim_k / kBlockValues + a.kv_dim_v / kBlockValues);
  if (blocks <= 0) return cudaSuccess;
  // One resident wave of blocks (each warp then walks several windows, which the pipeline
  // needs), or fewer when there is less work.
  int device = 0, sms = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (const cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      err != cudaSuccess)
    return err;
  const long long wave = static_cast<long long>(sms) * kBlocksPerSm;
  // A batch: one row of blocks per position, the wave shared between them.
  const int positions = a.batch.slots != nullptr ? a.max_batch : 1;
  if (positions < 1) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(std::min((blocks + kThreads - 1) / kThreads,
                                                 std::max(1LL, wave / positions))),
                  static_cast<unsigned>(positions));
  switch (a.dtype) {
    case DType::f32:
      return launch_typed<DType::f32>(a, mode, grid, stream);
    case DType::f16:
      return launch_typed<DType::f16>(a, mode, grid, stream);
    case DType::bf16:
      return launch_typed<DType::bf16>(a, mode, grid, stream);
  }
  return cudaErrorInvalidValue;
}

KVLAYER_DEFINE_MUTANT_UNIT(append)

}  // namespace kvlayer::cuda::detail
