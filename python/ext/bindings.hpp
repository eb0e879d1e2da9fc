// Shared plumbing of the kvlayer Python extension (_kvlayer): NumPy arrays in and out, and the
// three parts that fill the module (core.cpp, reference.cpp, cuda.cpp).
//
// NOTE: the extension is deliberately low-level: it takes contiguous byte or float arrays,
// integer device pointers and stream handles, and does kvlayer's own checks only (their
// messages are the library's). Shapes, dtypes and tensors are looked at by the Python package
// (src/kvlayer/_checks.py), which calls it: one place for the binding's own messages, shared by
// the reference and the CUDA layer.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "kvlayer/accuracy.hpp"
#include "kvlayer/dtype.hpp"
#include "kvlayer/error.hpp"
#include "kvlayer/geometry.hpp"
#include "kvlayer/reference/accuracy.hpp"

namespace kvlayer::python {

namespace nb = nanobind;

/// Read-only C-contiguous host bytes (a row buffer viewed as uint8, a plane, a snapshot's rows).
using HostBytes = nb::ndarray<const std::uint8_t, nb::c_contig, nb::device::cpu>;
/// Read-only C-contiguous host f32 values (queries, quantizer input).
using HostFloats = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;

/// A NumPy array that owns `values` (moved to the heap, freed with the array).
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& values,
                                   std::initializer_list<std::size_t> shape) {
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape, owner);
}

/// A read-only NumPy view of `data` kept alive by `owner` (a Python object owning the bytes).
template <typename T>
nb::ndarray<nb::numpy, const T> view_numpy(const T* data, std::initializer_list<std::size_t> shape,
                                           nb::handle owner) {
  return nb::ndarray<nb::numpy, const T>(data, shape, owner);
}

/// The bound of a decode (one row) or a verify decode (T rows, concatenated in row order) and
/// the output shape its arrays take in Python: (n_q_heads, head_dim_v) or (T, n_q_heads,
/// head_dim_v).
struct PyDecodeBound {
  ref::DecodeBound b;
  std::vector<std::size_t> shape;
};

/// "refused", "device" or "io": kvlayer.Error's `kind`.
const char* error_kind_name(ErrorKind kind);

/// The DType of the Python package's dtype code (0 f32, 1 f16, 2 bf16); any other code is
/// passed through as that value so that the library refuses it with its own message.
DType dtype_of(int code);

void bind_core(nb::module_& m);
void bind_reference(nb::module_& m);
void bind_cuda(nb::module_& m);

}  // namespace kvlayer::python
