// The CUDA KvLayer behind the harness's System interface (system.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvlayer/harness/generate.hpp"

namespace kvlayer::harness {

/// True when a CUDA device can be used by this process.
bool cuda_device_available();

/// Every split-kernel instance a CUDA plan can select on the current device, named as the
/// coverage table names them ("mma_direct d128 r8"): the instances a campaign's coverage floors
/// require. `wgmma_verify`: the campaign draws DecodeChoice::Verify::wgmma (its instances count
/// only where the device and the build have warpgroup MMA).
std::vector<std::string> cuda_selectable_instances(bool wgmma_verify);

/// A factory making a CudaSystem per case. NOTE: the stream, input staging buffers and the
/// CUDA context are process-wide, so a case costs only its layer's allocations.
SystemFactory cuda_system_factory();

}  // namespace kvlayer::harness
