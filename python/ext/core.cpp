// The core vocabulary for Python: Geometry, AccumulationShape, the sticky status, snapshots and
// their GGUF file, the q8_0 / q5_1 quantizers over NumPy arrays, and bfloat16 conversions.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "kvlayer/half.hpp"
#include "kvlayer/reference/quantize.hpp"
#include "kvlayer/snapshot.hpp"
#include "kvlayer/snapshot_file.hpp"
#include "kvlayer/status.hpp"

namespace kvlayer::python {
namespace {

std::string storage_name(Storage s) {
  return s == Storage::ring ? "ring" : "flat";
}

Storage storage_of(const std::string& name) {
  if (name == "flat") return Storage::flat;
  if (name == "ring") return Storage::ring;
  refuse("geometry", "storage '", name, "' is not 'flat' or 'ring'");
}

const char* device_error_kind_name(DeviceErrorKind k) {
  switch (k) {
    case DeviceErrorKind::append_outside_rows:
      return "append_outside_rows";
    case DeviceErrorKind::append_past_max_ctx:
      return "append_past_max_ctx";
    case DeviceErrorKind::decode_view_too_long:
      return "decode_view_too_long";
  }
  return "unknown";
}

ref::BlockType block_type_of(const std::string& format, const char* op) {
  if (format == "q8_0") return ref::BlockType::q8_0;
  if (format == "q5_1") return ref::BlockType::q5_1;
  refuse(op, "format '", format, "' is not 'q8_0' or 'q5_1'");
}

/// A non-null pointer for a view of zero elements (NumPy takes no null data pointer).
template <typename T>
const T* nonnull(const T* p) {
  static const T dummy{};
  return p != nullptr ? p : &dummy;
}

}  // namespace

void bind_core(nb::module_& m) {
  nb::class_<Geometry>(m, "Geometry",
                       "The shape of one attention layer's KV cache (SPEC §1, §6); plain data, "
                       "validated by the layers' constructors (or validate()).")
      .def(nb::init<>())
      .def_rw("n_kv_heads", &Geometry::n_kv_heads)
      .def_rw("head_dim_k", &Geometry::head_dim_k)
      .def_rw("head_dim_v", &Geometry::head_dim_v)
      .def_rw("max_ctx", &Geometry::max_ctx)
      .def_rw("window", &Geometry::window, nb::for_setter(nb::arg("value").none()))
      .def_prop_rw(
          "storage", [](const Geometry& g) { return storage_name(g.storage); },
          [](Geometry& g, const std::string& s) { g.storage = storage_of(s); })
      .def_rw("max_append", &Geometry::max_append)
      .def_rw("rewind_slack", &Geometry::rewind_slack)
      .def_prop_ro("rows", &Geometry::rows, "physical rows of each plane")
      .def_prop_ro("kv_dim_k", &Geometry::kv_dim_k)
      .def_prop_ro("kv_dim_v", &Geometry::kv_dim_v)
      .def_prop_ro("k_tok_bytes", &Geometry::k_tok_bytes, "bytes of one row of the K plane")
      .def_prop_ro("v_tok_bytes", &Geometry::v_tok_bytes, "bytes of one row of the V plane")
      .def("validate", &Geometry::validate)
      .def("describe", &Geometry::describe)
      .def("same_layout", &same_layout, nb::arg("other"))
      .def("__repr__", [](const Geometry& g) { return "<kvlayer.Geometry " + g.describe() + ">"; })
      .def("__eq__", [](const Geometry& a, const Geometry& b) {
        return a.n_kv_heads == b.n_kv_heads && a.head_dim_k == b.head_dim_k &&
               a.head_dim_v == b.head_dim_v && a.max_ctx == b.max_ctx && a.window == b.window &&
               a.storage == b.storage && a.max_append == b.max_append &&
               a.rewind_slack == b.rewind_slack;
      });

  nb::class_<AccumulationShape>(
      m, "AccumulationShape",
      "A GPU decode's launch shape that enters the accuracy bound (kvlayer/accuracy.hpp): "
      "take it from kvlayer.KvLayer.accumulation_shape() or verify_accumulation_shape(T).")
      .def(
          "__init__",
          [](AccumulationShape* self, std::int64_t max_keys_per_split, std::int64_t n_splits,
             std::int64_t rescales, bool tensor_core, std::int64_t pv_mma_steps, bool k_fused_f16) {
            new (self) AccumulationShape{max_keys_per_split, n_splits,     rescales,
                                         tensor_core,        pv_mma_steps, k_fused_f16};
          },
          nb::arg("max_keys_per_split") = 1, nb::arg("n_splits") = 1, nb::arg("rescales") = -1,
          nb::arg("tensor_core") = false, nb::arg("pv_mma_steps") = 0,
          nb::arg("k_fused_f16") = false)
      .def_rw("max_keys_per_split", &AccumulationShape::max_keys_per_split)
      .def_rw("n_splits", &AccumulationShape::n_splits)
      .def_rw("rescales", &AccumulationShape::rescales)
      .def_rw("tensor_core", &AccumulationShape::tensor_core)
      .def_rw("pv_mma_steps", &AccumulationShape::pv_mma_steps)
      .def_rw("k_fused_f16", &AccumulationShape::k_fused_f16)
      .def("__repr__", [](const AccumulationShape& s) {
        return detail::concat("AccumulationShape(max_keys_per_split=", s.max_keys_per_split,
                              ", n_splits=", s.n_splits, ", rescales=", s.rescales,
                              ", tensor_core=", s.tensor_core ? "True" : "False",
                              ", pv_mma_steps=", s.pv_mma_steps,
                              ", k_fused_f16=", s.k_fused_f16 ? "True" : "False", ")");
      });

  nb::class_<DataError>(m, "DataError", "A block written as the canonical bad block (SPEC §3).")
      .def_ro("row", &DataError::row, "logical row")
      .def_prop_ro("plane", [](const DataError& e) { return e.plane == Plane::k ? "K" : "V"; })
      .def_ro("block", &DataError::block, "block index inside the row")
      .def_ro("value", &DataError::value,
              "the first non-finite value, else the value of largest magnitude")
      .def("__eq__", [](const DataError& a, const DataError& b) { return a == b; })
      .def("__repr__", [](const DataError& e) { return describe(e); });

  nb::class_<DeviceError>(m, "DeviceError", "A device-counter step that wrote nothing (SPEC §7).")
      .def_prop_ro("kind", [](const DeviceError& e) { return device_error_kind_name(e.kind); })
      .def_ro("len_d", &DeviceError::len_d)
      .def_ro("base_d", &DeviceError::base_d)
      .def_ro("limit", &DeviceError::limit)
      .def("__eq__", [](const DeviceError& a, const DeviceError& b) { return a == b; })
      .def("__repr__", [](const DeviceError& e) { return describe(e); });

  nb::class_<LayerStatus>(m, "LayerStatus",
                          "A layer's sticky errors: ok, or a data error and/or a device error.")
      .def_prop_ro("ok", &LayerStatus::ok)
      .def_ro("data_error", &LayerStatus::data_error)
      .def_ro("device_error", &LayerStatus::device_error)
      .def_prop_ro("message", &LayerStatus::message)
      .def("__bool__", &LayerStatus::ok)
      .def("__eq__", [](const LayerStatus& a, const LayerStatus& b) { return a == b; })
      .def("__repr__",
           [](const LayerStatus& s) { return "<kvlayer.LayerStatus " + s.message() + ">"; });

  nb::class_<Snapshot>(m, "Snapshot",
                       "A layer's live rows taken out of it (SPEC §13): KvLayer.snapshot(), "
                       "KvLayer.restore(), save_snapshot(), load_snapshot().")
      .def_ro("geometry", &Snapshot::geometry)
      .def_ro("len", &Snapshot::len)
      .def_ro("first", &Snapshot::first)
      .def_ro("base", &Snapshot::base)
      .def_prop_ro("rows", &Snapshot::rows)
      .def_prop_ro(
          "k",
          [](const Snapshot& s) {
            return view_numpy(nonnull(s.k.data()),
                              {std::size_t(s.rows()), std::size_t(s.geometry.k_tok_bytes())},
                              nb::find(s));
          },
          "the K bytes of the rows [first, len): (rows, k_tok_bytes) uint8, read-only")
      .def_prop_ro(
          "v",
          [](const Snapshot& s) {
            return view_numpy(nonnull(s.v.data()),
                              {std::size_t(s.rows()), std::size_t(s.geometry.v_tok_bytes())},
                              nb::find(s));
          },
          "the V bytes of the rows [first, len): (rows, v_tok_bytes) uint8, read-only")
      .def(
          "encode",
          [](const Snapshot& s) {
            const std::vector<std::uint8_t> b = encode_snapshot(s);
            return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
          },
          "the GGUF file's bytes")
      .def_static(
          "parse",
          [](nb::bytes file, const std::string& name) {
            return parse_snapshot(
                std::span(reinterpret_cast<const std::uint8_t*>(file.c_str()), file.size()), name);
          },
          nb::arg("file"), nb::arg("name") = "<bytes>")
      .def("__repr__", [](const Snapshot& s) {
        return detail::concat("<kvlayer.Snapshot ", s.geometry.describe(), " len ", s.len,
                              " first ", s.first, " base ", s.base, ">");
      });
  m.def("save_snapshot", &save_snapshot, nb::arg("path"), nb::arg("snapshot"),
        nb::call_guard<nb::gil_scoped_release>(),
        "Writes a snapshot as a GGUF file, crash-safely (temporary file, fsync, rename).");
  m.def("load_snapshot", &load_snapshot, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>(),
        "Reads a snapshot file; a bad file raises kvlayer.Error (kind 'io') naming the field.");

  // Row quantizers (SPEC §2-4); the Python package checks the array and reshapes.
  m.def(
      "quantize_row",
      [](const std::string& format, HostFloats x) {
        const ref::BlockType t = block_type_of(format, "quantize");
        if (x.size() % kBlockValues != 0)
          refuse("quantize", "x has ", x.size(), " values, not a multiple of ", kBlockValues);
        std::vector<std::uint8_t> out(x.size() / kBlockValues * std::size_t(ref::block_bytes(t)));
        std::optional<ref::BadBlock> bad;
        {
          nb::gil_scoped_release unlocked;
          bad = ref::quantize_row(t, std::span(x.data(), x.size()), out);
        }
        std::optional<std::pair<std::int64_t, float>> first_bad;
        if (bad) first_bad = std::pair{bad->block, bad->value};
        return std::pair{
            to_numpy(std::move(out), {x.size() / kBlockValues * std::size_t(ref::block_bytes(t))}),
            first_bad};
      },
      nb::arg("format"), nb::arg("x"),
      "(bytes, (block, value) of the first bad block or None); bad blocks are written as the "
      "canonical bad block");
  m.def(
      "dequantize_row",
      [](const std::string& format, HostBytes b) {
        const ref::BlockType t = block_type_of(format, "dequantize");
        const auto bb = std::size_t(ref::block_bytes(t));
        if (b.size() % bb != 0)
          refuse("dequantize", "data has ", b.size(), " bytes, not a multiple of the ", format,
                 " block's ", bb);
        std::vector<float> out(b.size() / bb * kBlockValues);
        {
          nb::gil_scoped_release unlocked;
          ref::dequantize_row(t, std::span(b.data(), b.size()), out);
        }
        const std::size_t n = out.size();
        return to_numpy(std::move(out), {n});
      },
      nb::arg("format"), nb::arg("data"));

  // bfloat16 without ml_dtypes: uint16 bits, rounded to nearest even as kvlayer rounds.
  m.def(
      "f32_to_bf16_bits",
      [](HostFloats x) {
        std::vector<std::uint16_t> out(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16_bits(x.data()[i]);
        const std::size_t n = out.size();
        return to_numpy(std::move(out), {n});
      },
      nb::arg("x"));
  m.def(
      "bf16_bits_to_f32",
      [](nb::ndarray<const std::uint16_t, nb::c_contig, nb::device::cpu> x) {
        std::vector<float> out(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) out[i] = bf16_bits_to_f32(x.data()[i]);
        const std::size_t n = out.size();
        return to_numpy(std::move(out), {n});
      },
      nb::arg("bits"));
}

}  // namespace kvlayer::python
