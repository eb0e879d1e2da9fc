// kvlayer probe: what the decode's memory access pattern costs without its arithmetic. Reads
// the planes of a decode_dc (8 KV heads × 128) with each ProbePattern, in one run with the
// streaming-read ceiling, from plain cudaMalloc planes and from planes mapped through the
// virtual-memory API with compression off (to rule L2 compression in or out).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "access_probe.hpp"
#include "commands.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "gpu_timing.hpp"
#include "kvlayer/error.hpp"
#include "stream_read.hpp"

namespace kvlayer::cli {
namespace {

using cuda::DeviceBuffer;
using cuda::Stream;

constexpr std::string_view kUsage =
    "usage: kvlayer probe [--keys N] [--splits S] [--reps N] [--l2-fetch BYTES]\n"
    "  Times the decode's memory access patterns alone (8x128, no arithmetic) against the\n"
    "  streaming-read ceiling: decode_mma_direct's loads, the same with one block per 4 KV\n"
    "  heads, 16-byte windows, whole rows. Each on cudaMalloc planes and on VMM planes mapped\n"
    "  without compression. Medians of CUDA events, L2 kept cold by rotating copies.\n"
    "  --keys N    keys per plane, a multiple of 16 (default: 16384 and 131072)\n"
    "  --splits S  splits per KV head, as the decode plan's n_splits (default 49)\n"
    "  --reps N    timed repetitions (default 30)\n"
    "  --l2-fetch BYTES  cudaLimitMaxL2FetchGranularity for the run (0..128; default: as set)\n";

/// Device memory from cuMemCreate + cuMemMap with an explicit compression type, through the
/// runtime's driver entry points (no link against libcuda).
class VmmBuffer {
 public:
  VmmBuffer(std::size_t bytes, unsigned char compression) {
    resolve();
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.allocFlags.compressionType = compression;
    std::size_t gran = 0;
    check(get_granularity_(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
          "cuMemGetAllocationGranularity");
    bytes_ = (bytes + gran - 1) / gran * gran;
    check(create_(&handle_, bytes_, &prop, 0), "cuMemCreate");
    check(reserve_(&ptr_, bytes_, gran, 0, 0), "cuMemAddressReserve");
    check(map_(ptr_, bytes_, 0, handle_, 0), "cuMemMap");
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check(set_access_(ptr_, bytes_, &access, 1), "cuMemSetAccess");
  }
  VmmBuffer(const VmmBuffer&) = delete;
  VmmBuffer& operator=(const VmmBuffer&) = delete;
  ~VmmBuffer() {
    if (ptr_) (void)unmap_(ptr_, bytes_);
    if (handle_) (void)release_(handle_);
    if (ptr_) (void)address_free_(ptr_, bytes_);
  }
  void* get() const { return reinterpret_cast<void*>(ptr_); }

 private:
  template <typename F>
  static void entry(const char* name, F& f) {
    cudaDriverEntryPointQueryResult q{};
    void* p = nullptr;
    KVLAYER_CUDA_TRY(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !p)
      throw Error(ErrorKind::device, std::string("driver entry point ") + name + " missing");
    f = reinterpret_cast<F>(p);
  }
  static void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS)
      throw Error(ErrorKind::device,
                  std::string(what) + " failed (CUresult " + std::to_string(int(r)) + ")");
  }
  void resolve() {
    entry("cuMemGetAllocationGranularity", get_granularity_);
    entry("cuMemCreate", create_);
    entry("cuMemAddressReserve", reserve_);
    entry("cuMemMap", map_);
    entry("cuMemSetAccess", set_access_);
    entry("cuMemUnmap", unmap_);
    entry("cuMemRelease", release_);
    entry("cuMemAddressFree", address_free_);
  }

  CUresult (*get_granularity_)(size_t*, const CUmemAllocationProp*,
                               CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*create_)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                      unsigned long long) = nullptr;
  CUresult (*reserve_)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*map_)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                   unsigned long long) = nullptr;
  CUresult (*set_access_)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*unmap_)(CUdeviceptr, size_t) = nullptr;
  CUresult (*release_)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*address_free_)(CUdeviceptr, size_t) = nullptr;
  CUmemGenericAllocationHandle handle_{};
  CUdeviceptr ptr_{};
  std::size_t bytes_ = 0;
};

/// One copy of the planes: random bytes (never zeros), in either kind of memory.
struct PlaneCopy {
  std::unique_ptr<DeviceBuffer> plain;
  std::unique_ptr<VmmBuffer> vmm;
  std::uint8_t* base = nullptr;
};

int run_probe(const std::vector<std::string>& args) {
  const Options o(args, {"keys", "splits", "reps", "l2-fetch"}, {});
  const long long l2_fetch = o.integer("l2-fetch", -1, 0, 128);
  const int reps = int(o.integer("reps", 30, 3, 100000));
  const int splits = int(o.integer("splits", 49, 1, 4096));
  std::vector<long long> lengths{16384, 131072};
  if (o.get("keys")) {
    const long long k = o.integer("keys", 0, 1024, 1LL << 22);
    if (k % 16 != 0) throw UsageError("--keys " + std::to_string(k) + " must be a multiple of 16");
    lengths = {k};
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0)
    throw Error(ErrorKind::device, "no CUDA device found (run it on the GPU machine)");
  cudaDeviceProp p{};
  KVLAYER_CUDA_TRY(cudaGetDeviceProperties(&p, 0));
  if (l2_fetch >= 0)
    KVLAYER_CUDA_TRY(cudaDeviceSetLimit(cudaLimitMaxL2FetchGranularity, std::size_t(l2_fetch)));
  std::size_t fetch = 0;
  KVLAYER_CUDA_TRY(cudaDeviceGetLimit(&fetch, cudaLimitMaxL2FetchGranularity));
  Stream stream;
  const cudaStream_t s = stream.get();
  DeviceBuffer sink(std::size_t(1) << 20);

  const std::size_t ceiling_bytes = std::size_t(2) << 30;
  double ceiling_gbs = 0;
  {
    DeviceBuffer data(ceiling_bytes);
    KVLAYER_CUDA_TRY(launch_fill_random(data.as<float>(), ceiling_bytes / 4, 7, s));
    const double us = median_us(s, 3, reps, [&](int) {
      KVLAYER_CUDA_TRY(launch_stream_read(data.get(), ceiling_bytes, sink.as<unsigned>(),
                                          p.multiProcessorCount * 8, s));
    });
    ceiling_gbs = double(ceiling_bytes) / us / 1e3;
  }
  std::printf(
      "kvlayer probe on %s (%d SMs, L2 %d MiB, L2 fetch granularity %zu B), %d splits per KV "
      "head, %d reps, medians\n",
      p.name, p.multiProcessorCount, p.l2CacheSize >> 20, fetch, splits, reps);
  std::printf("streaming-read ceiling: %.0f GB/s\n\n", ceiling_gbs);
  std::printf("%-24s %-16s %8s %10s %8s %10s\n", "pattern", "memory", "keys", "µs", "GB/s",
              "% ceiling");

  for (const long long keys : lengths) {
    const std::size_t k_bytes = std::size_t(keys) * 1088, v_bytes = std::size_t(keys) * 768;
    const std::size_t copy_bytes = k_bytes + v_bytes;
    const int copies =
        int(std::clamp(std::ceil(4.0 * double(p.l2CacheSize) / double(copy_bytes)), 2.0, 48.0));
    for (const bool vmm : {false, true}) {
      std::vector<PlaneCopy> planes(static_cast<std::size_t>(copies));
      for (int c = 0; c < copies; ++c) {
        PlaneCopy& pc = planes[std::size_t(c)];
        if (vmm) {
          pc.vmm = std::make_unique<VmmBuffer>(copy_bytes, CU_MEM_ALLOCATION_COMP_NONE);
          pc.base = static_cast<std::uint8_t*>(pc.vmm->get());
        } else {
          pc.plain = std::make_unique<DeviceBuffer>(copy_bytes);
          pc.base = pc.plain->as<std::uint8_t>();
        }
        KVLAYER_CUDA_TRY(
            launch_fill_random(reinterpret_cast<float*>(pc.base), copy_bytes / 4, 11 + c, s));
      }
      const auto report = [&](std::string_view name, double us) {
        const double gbs = double(copy_bytes) / us / 1e3;
        std::printf("%-24s %-16s %8lld %10.2f %8.0f %9.1f%%\n", std::string(name).c_str(),
                    vmm ? "vmm, no compr." : "cudaMalloc", keys, us, gbs,
                    100.0 * gbs / ceiling_gbs);
      };
      // The same bytes read by the ceiling's kernel: the floor any pattern can reach.
      report("stream_read", median_us(s, 3, reps, [&](int i) {
               const PlaneCopy& pc = planes[std::size_t(i) % planes.size()];
               KVLAYER_CUDA_TRY(launch_stream_read(pc.base, copy_bytes, sink.as<unsigned>(),
                                                   p.multiProcessorCount * 8, s));
             }));
      for (const ProbePattern pattern : kProbePatterns) {
        report(probe_pattern_name(pattern), median_us(s, 3, reps, [&](int i) {
                 const PlaneCopy& pc = planes[std::size_t(i) % planes.size()];
                 const ProbePlanes pl{pc.base, pc.base + k_bytes, keys};
                 KVLAYER_CUDA_TRY(launch_access_probe(pattern, pl, splits, sink.as<unsigned>(), s));
               }));
      }
    }
  }
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(s));
  return kExitOk;
}

}  // namespace

const Command& probe_command() {
  static const Command c{"probe", "GPU: the decode's memory access patterns alone vs the ceiling",
                         kUsage, &run_probe};
  return c;
}

}  // namespace kvlayer::cli
