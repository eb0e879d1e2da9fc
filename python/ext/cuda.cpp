// kvlayer::cuda::KvLayer for Python (the Python package's kvlayer.KvLayer wraps it): device
// pointers and stream handles as integers, so that PyTorch tensors (data_ptr()), CuPy arrays
// and anything with __cuda_array_interface__ cross without a copy and every call runs on the
// stream the caller names (the package passes torch.cuda.current_stream() by default).
//
// NOTE: pointers cross as integers, not through DLPack: torch's __dlpack__() makes the legacy
// default stream wait on the current one, which is illegal while the current stream is being
// captured (torch.cuda.graph) and needless otherwise.
#include <cuda_runtime_api.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/runtime.hpp"

namespace kvlayer::python {
namespace {

cudaStream_t stream_of(std::uintptr_t handle) {
  return reinterpret_cast<cudaStream_t>(handle);
}

template <typename T>
T* pointer_of(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

/// A CUDA layer that can be closed before Python drops it (close(), a with block).
struct CudaLayer {
  std::unique_ptr<cuda::KvLayer> layer;

  CudaLayer(const Geometry& g, int nq, int max_verify, int device, std::uintptr_t stream) {
    // The layer belongs to the device current at its construction; the caller's device is
    // current again afterwards.
    const cuda::DeviceGuard on(device);
    layer = std::make_unique<cuda::KvLayer>(g, nq, stream_of(stream), max_verify);
  }

  cuda::KvLayer& get() const {
    if (!layer) refuse("kvlayer.KvLayer", "the layer is closed");
    return *layer;
  }

  /// The layer with `stream` as the stream of the call about to be made.
  cuda::KvLayer& on(std::uintptr_t stream) const {
    cuda::KvLayer& l = get();
    l.set_stream(stream_of(stream));
    return l;
  }
};

nb::ndarray<nb::numpy, const std::uint8_t> plane_array(std::vector<std::uint8_t>&& bytes,
                                                       std::int64_t rows, std::int64_t tok) {
  auto* heap = new std::vector<std::uint8_t>(std::move(bytes));
  nb::capsule owner(heap,
                    [](void* p) noexcept { delete static_cast<std::vector<std::uint8_t>*>(p); });
  return nb::ndarray<nb::numpy, const std::uint8_t>(heap->data(),
                                                    {std::size_t(rows), std::size_t(tok)}, owner);
}

}  // namespace

void bind_cuda(nb::module_& m) {
  // The head dims the kernels are compiled for, from the one table (limits.hpp).
  nb::list head_dims;
  for (const int d : cuda::kSupportedHeadDims) head_dims.append(d);
  m.attr("cuda_head_dims") = nb::tuple(head_dims);
  // (count, "") with a working driver, else (0, the CUDA error string): the package's
  // "the CUDA layer is unavailable" message.
  m.def("cuda_device_count", [] {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      return std::pair<int, std::string>{
          0, std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err)};
    }
    return std::pair<int, std::string>{n, std::string()};
  });
  m.def("cuda_current_device", [] {
    int d = 0;
    KVLAYER_CUDA_TRY(cudaGetDevice(&d));
    return d;
  });
  // (memory type, device) of a pointer: 0 unregistered host, 1 registered host, 2 device,
  // 3 managed (cudaMemoryType). For arrays given by __cuda_array_interface__, whose device
  // the package cannot otherwise see.
  m.def(
      "cuda_pointer_device",
      [](std::uintptr_t p) {
        cudaPointerAttributes a{};
        KVLAYER_CUDA_TRY_NAMED(cudaPointerGetAttributes(&a, pointer_of<const void>(p)),
                               "cudaPointerGetAttributes");
        return std::pair<int, int>{int(a.type), a.device};
      },
      nb::arg("pointer"));

  nb::class_<CudaLayer>(m, "CudaLayer", "cuda::KvLayer (low level: use kvlayer.KvLayer)")
      .def(nb::init<const Geometry&, int, int, int, std::uintptr_t>(), nb::arg("geometry"),
           nb::arg("n_q_heads"), nb::arg("max_verify"), nb::arg("device"), nb::arg("stream"))
      .def(
          "close",
          [](CudaLayer& c, std::uintptr_t stream) {
            if (!c.layer) return;
            c.on(stream);
            nb::gil_scoped_release unlocked;  // the destructor waits for the stream
            c.layer.reset();
          },
          nb::arg("stream"))
      .def_prop_ro("closed", [](const CudaLayer& c) { return !c.layer; })
      .def(
          "append_op",
          [](CudaLayer& c, const std::string& op, std::uintptr_t k, std::uintptr_t v,
             std::int64_t n, int dtype, std::uintptr_t stream) {
            cuda::KvLayer& l = c.on(stream);
            const cuda::RowsView rows{pointer_of<const void>(k), pointer_of<const void>(v), n,
                                      dtype_of(dtype)};
            if (op == "append") return l.append(rows);
            if (op == "append_dc") return l.append_dc(rows);
            if (op == "append_dcw") return l.append_dcw(rows);
            if (op == "append_rows_dc") return l.append_rows_dc(rows);
            if (op == "append_rows_dcw") return l.append_rows_dcw(rows);
            refuse("append_op", "unknown operation '", op, "'");
          },
          nb::arg("op"), nb::arg("k"), nb::arg("v"), nb::arg("n"), nb::arg("dtype"),
          nb::arg("stream"))
      .def(
          "decode_op",
          [](CudaLayer& c, const std::string& op, std::uintptr_t q, std::uintptr_t out, int t,
             std::optional<float> scale, std::uintptr_t stream) {
            cuda::KvLayer& l = c.on(stream);
            const float* qp = pointer_of<const float>(q);
            float* op_out = pointer_of<float>(out);
            if (op == "decode") return l.decode(qp, op_out, scale);
            if (op == "decode_dc") return l.decode_dc(qp, op_out, scale);
            if (op == "decode_dcw") return l.decode_dcw(qp, op_out, scale);
            if (op == "decode_rows") return l.decode_rows(qp, op_out, t, scale);
            if (op == "decode_rows_dc") return l.decode_rows_dc(qp, op_out, t, scale);
            if (op == "decode_rows_dcw") return l.decode_rows_dcw(qp, op_out, t, scale);
            refuse("decode_op", "unknown operation '", op, "'");
          },
          nb::arg("op"), nb::arg("q"), nb::arg("out"), nb::arg("t"), nb::arg("scale").none(),
          nb::arg("stream"))
      .def(
          "inc_seqlen", [](CudaLayer& c, int t, std::uintptr_t s) { c.on(s).inc_seqlen(t); },
          nb::arg("t"), nb::arg("stream"))
      .def(
          "account_steps", [](CudaLayer& c, std::int64_t k) { c.get().account_steps(k); },
          nb::arg("k"))
      .def(
          "rewind", [](CudaLayer& c, std::int64_t n, std::uintptr_t s) { c.on(s).rewind(n); },
          nb::arg("new_len"), nb::arg("stream"))
      .def(
          "reserve", [](CudaLayer& c, std::int64_t k, std::uintptr_t s) { c.on(s).reserve(k); },
          nb::arg("k"), nb::arg("stream"))
      .def("can_rewind_to",
           [](const CudaLayer& c, std::int64_t p) { return c.get().can_rewind_to(p); })
      .def("physical_rows", [](const CudaLayer& c, std::int64_t s,
                               std::int64_t e) { return c.get().physical_rows(s, e); })
      .def("view", [](const CudaLayer& c) { return c.get().view(); })
      // The calls below synchronize the stream: the GIL is released while they wait.
      .def(
          "status",
          [](CudaLayer& c, std::uintptr_t s) {
            cuda::KvLayer& l = c.on(s);
            nb::gil_scoped_release unlocked;
            return l.status();
          },
          nb::arg("stream"))
      .def(
          "clear_status", [](CudaLayer& c, std::uintptr_t s) { c.on(s).clear_status(); },
          nb::arg("stream"))
      .def(
          "k_plane",
          [](CudaLayer& c, std::uintptr_t s) {
            cuda::KvLayer& l = c.on(s);
            std::vector<std::uint8_t> b;
            {
              nb::gil_scoped_release unlocked;
              b = l.k_plane_bytes();
            }
            return plane_array(std::move(b), l.rows(), l.geometry().k_tok_bytes());
          },
          nb::arg("stream"))
      .def(
          "v_plane",
          [](CudaLayer& c, std::uintptr_t s) {
            cuda::KvLayer& l = c.on(s);
            std::vector<std::uint8_t> b;
            {
              nb::gil_scoped_release unlocked;
              b = l.v_plane_bytes();
            }
            return plane_array(std::move(b), l.rows(), l.geometry().v_tok_bytes());
          },
          nb::arg("stream"))
      .def(
          "read_len_d",
          [](CudaLayer& c, std::uintptr_t s) {
            cuda::KvLayer& l = c.on(s);
            nb::gil_scoped_release unlocked;
            return l.read_len_d();
          },
          nb::arg("stream"))
      .def(
          "read_base_d",
          [](CudaLayer& c, std::uintptr_t s) {
            cuda::KvLayer& l = c.on(s);
            nb::gil_scoped_release unlocked;
            return l.read_base_d();
          },
          nb::arg("stream"))
      .def(
          "snapshot",
          [](CudaLayer& c, std::uintptr_t s) {
            cuda::KvLayer& l = c.on(s);
            nb::gil_scoped_release unlocked;
            return l.snapshot();
          },
          nb::arg("stream"))
      .def(
          "restore",
          [](CudaLayer& c, const Snapshot& snap, std::uintptr_t s) {
            cuda::KvLayer& l = c.on(s);
            nb::gil_scoped_release unlocked;
            l.restore(snap);
          },
          nb::arg("snapshot"), nb::arg("stream"))
      .def_prop_ro("fresh", [](const CudaLayer& c) { return c.get().fresh(); })
      .def_prop_ro("len", [](const CudaLayer& c) { return c.get().len(); })
      .def_prop_ro("base", [](const CudaLayer& c) { return c.get().base(); })
      .def_prop_ro("rows", [](const CudaLayer& c) { return c.get().rows(); })
      .def_prop_ro("device", [](const CudaLayer& c) { return c.get().device(); })
      .def_prop_ro("max_verify", [](const CudaLayer& c) { return c.get().max_verify(); })
      .def_prop_ro("n_q_heads", [](const CudaLayer& c) { return c.get().n_q_heads(); })
      .def_prop_ro("geometry", [](const CudaLayer& c) { return c.get().geometry(); })
      .def_prop_ro(
          "stream",
          [](const CudaLayer& c) { return reinterpret_cast<std::uintptr_t>(c.get().stream()); })
      .def("accumulation_shape", [](const CudaLayer& c) { return c.get().accumulation_shape(); })
      .def(
          "verify_accumulation_shape",
          [](const CudaLayer& c, int t) { return c.get().verify_accumulation_shape(t); },
          nb::arg("t"))
      .def("default_scale", [](const CudaLayer& c) { return c.get().default_scale(); })
      .def("decode_plan", [](const CudaLayer& c) {
        const cuda::DecodePlanInfo p = c.get().decode_plan();
        nb::dict d;
        d["max_view_keys"] = p.max_view_keys;
        d["n_splits"] = p.n_splits;
        d["max_keys_per_split"] = p.max_keys_per_split;
        d["scratch_bytes"] = p.scratch_bytes;
        d["kernel"] = std::string(p.kernel);
        d["rows_per_block"] = p.rows_per_block;
        return d;
      });
}

}  // namespace kvlayer::python
