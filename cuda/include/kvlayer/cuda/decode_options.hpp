// How a layer plans its decode grid: a value read once, at construction, that the planner takes
// (it reads nothing else). The defaults are the measured choices (bench/NOTES.md); the other
// settings exist so that every kernel path can be reached on purpose (the model-based harness
// draws them per case) and compared in benchmarks. Every setting gives the same results within
// the same accuracy contract: the bound takes its shape from the plan the options make.
#pragma once

#include <cstdint>

namespace kvlayer::cuda {

struct DecodeOptions {
  /// The implementation family of decodes (T = 1); verify decodes always run on tensor cores.
  enum class Kernel : std::uint8_t {
    mma,        ///< tensor cores (the default)
    cuda_core,  ///< f32 FMAs on CUDA cores, a second implementation kept under test
  };
  /// gqa > 8 on tensor cores: one 16-row block per split, or two blocks of ≤ 8 rows.
  enum class Rows : std::uint8_t {
    automatic,  ///< two blocks where one per split would leave a quarter of the slots empty
    split,      ///< always two blocks (where the kernel has 8-row instances)
    whole,      ///< always one 16-row block
  };
  /// Verify decodes of T·gqa > 16 at head dim 128.
  enum class Verify : std::uint8_t {
    mma,  ///< the mma.sync verify kernel (the default)
    /// opt-in: warpgroup MMA where the device and the build have it (sm_90a on 9.0), else mma.
    /// Not yet run on a device (bench/NOTES.md): not the default until it is gated there.
    wgmma,
  };
  /// The default split balance: a view of n keys takes splits of at least 2·⌊√n⌋ keys.
  static constexpr int kDefaultSplitBalance = 2;
  static constexpr int kMaxSplitBalance = 64;
  /// The default batch schedule: split blocks of about Σ keys / (8 · resident blocks) keys.
  static constexpr int kDefaultBatchWaves = 8;
  static constexpr int kMaxBatchWaves = 64;

  Kernel kernel = Kernel::mma;
  Rows rows = Rows::automatic;
  Verify verify = Verify::mma;
  /// Decode splits of at least split_balance·⌊√n⌋ keys for a view of n keys, in [0, 64]: 0
  /// splits as finely as the grid allows (one tile per split); 64 runs views of up to 4096
  /// keys in one split.
  int split_balance = kDefaultSplitBalance;
  /// Verify decodes (T ≥ 2): at most this many splits along the keys (0: as many as fill the
  /// device), so that a split holds many tiles even at short views.
  int max_verify_splits = 0;
  /// Batch decodes (SPEC §12): the launch cuts its sequences' views into blocks of one length,
  /// about Σ keys / (batch_waves · resident split blocks), in [1, 64]: more waves, shorter
  /// blocks (each sequence at most the plan's splits, a view at least split_balance·⌊√Σ⌋ keys
  /// per block).
  int batch_waves = kDefaultBatchWaves;

  bool operator==(const DecodeOptions&) const = default;

  /// The defaults, overridden by KVLAYER_DECODE_KERNEL (mma, cuda_core), KVLAYER_DECODE_ROWS
  /// (auto, split, whole), KVLAYER_VERIFY_KERNEL (mma, wgmma), KVLAYER_SPLIT_BALANCE (0..64) and
  /// KVLAYER_BATCH_WAVES (1..64). Throws
  /// kvlayer::Error (refused) naming the variable and the supported values for any other value.
  static DecodeOptions from_environment();
};

/// The option names as the environment and reports spell them ("mma", "auto", …).
const char* decode_kernel_name(DecodeOptions::Kernel kernel);
const char* decode_rows_name(DecodeOptions::Rows rows);
const char* decode_verify_name(DecodeOptions::Verify verify);

}  // namespace kvlayer::cuda
