// What the split kernels (decode_cuda_core.cu, decode_mma_staged.cu, decode_mma_direct.cu,
// decode_mma_verify.cu), the merge (merge.cu) and the launch (launch.cu) share, one concept per
// header, so that every kernel obeys one definition.
#pragma once

#include "cp_async.cuh"
#include "decode/codec_q5_1.cuh"
#include "decode/codec_q8_0.cuh"
#include "decode/decode.hpp"
#include "decode/launchers.hpp"
#include "decode/mutant_hooks.cuh"
#include "decode/partition.hpp"
#include "decode/pdl.cuh"
#include "decode/softmax_state.cuh"
#include "decode/split_work.cuh"
#include "decode/view.cuh"
#include "device_status.cuh"
#include "kvlayer/block_format.hpp"
#include "mutants.cuh"
