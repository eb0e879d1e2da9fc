// kvlayer::ref::KvLayer for Python (the Python package's kvlayer.reference.KvLayer wraps it),
// ref::decode_bound / decode_rows_bound and BoundTightness.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::python {
namespace {

/// A reference layer and the query heads its decodes take (fixed here as the CUDA layer fixes
/// them at construction, so that both take the same calls).
struct RefLayer {
  ref::KvLayer layer;
  int n_q_heads;

  RefLayer(const Geometry& g, int nq, int max_verify) : layer(g, max_verify), n_q_heads(nq) {
    if (nq < 1 || nq % g.n_kv_heads != 0)
      refuse("ref::KvLayer", "n_q_heads ", nq, " must be a positive multiple of n_kv_heads ",
             g.n_kv_heads);
  }
};

std::span<const float> span_of(const HostFloats& q) {
  return {q.data(), q.size()};
}

ref::RowsView rows_of(const HostBytes& k, const HostBytes& v, std::int64_t n, int dtype) {
  return ref::RowsView{k.data(), v.data(), n, dtype_of(dtype)};
}

using Output = nb::ndarray<nb::numpy, double>;

Output decode_output(std::vector<double>&& out, const RefLayer& r) {
  return to_numpy(std::move(out),
                  {std::size_t(r.n_q_heads), std::size_t(r.layer.geometry().head_dim_v)});
}

Output rows_output(std::vector<double>&& out, const RefLayer& r, int t) {
  return to_numpy(std::move(out), {std::size_t(t), std::size_t(r.n_q_heads),
                                   std::size_t(r.layer.geometry().head_dim_v)});
}

std::optional<Output> maybe(std::optional<std::vector<double>>&& out, const RefLayer& r) {
  if (!out) return std::nullopt;
  return decode_output(std::move(*out), r);
}

std::optional<Output> maybe_rows(std::optional<std::vector<double>>&& out, const RefLayer& r,
                                 int t) {
  if (!out) return std::nullopt;
  return rows_output(std::move(*out), r, t);
}

/// Refuses a bound's view that leaves the rows the layer holds at that base: decode_bound reads
/// the planes at logical − base and checks nothing itself.
void check_view(const ref::KvLayer& l, const ref::DecodeView& v) {
  if (v.begin < 0 || v.begin > v.end || v.begin < v.base || v.end - v.base > l.rows())
    refuse("decode_bound", "view [", v.begin, ", ", v.end, ") at base ", v.base,
           " is not within the rows [", v.base, ", ", v.base + l.rows(), ")");
}

void check_bound_query(const RefLayer& r, std::size_t values, const char* op) {
  const std::int64_t want = std::int64_t(r.n_q_heads) * r.layer.geometry().head_dim_k;
  if (std::int64_t(values) != want)
    refuse(op, "q has ", values, " values, expected n_q_heads ", r.n_q_heads, " x head_dim_k ",
           r.layer.geometry().head_dim_k, " = ", want);
}

nb::ndarray<nb::numpy, const double> bound_array(const PyDecodeBound& b,
                                                 const std::vector<double>& v) {
  const auto& s = b.shape;
  const double* data = v.empty() ? nullptr : v.data();
  static const double dummy = 0;
  return nb::ndarray<nb::numpy, const double>(data ? data : &dummy, s.size(), s.data(),
                                              nb::find(b));
}

}  // namespace

void bind_reference(nb::module_& m) {
  using ref::DecodeView;
  using Views = std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>;

  nb::class_<RefLayer>(m, "RefLayer", "ref::KvLayer (low level: use kvlayer.reference.KvLayer)")
      .def(nb::init<const Geometry&, int, int>(), nb::arg("geometry"), nb::arg("n_q_heads"),
           nb::arg("max_verify"))
      .def(
          "append_op",
          [](RefLayer& r, const std::string& op, HostBytes k, HostBytes v, std::int64_t n,
             int dtype) {
            const ref::RowsView rows = rows_of(k, v, n, dtype);
            if (op == "append") return r.layer.append(rows);
            if (op == "append_dc") return r.layer.append_dc(rows);
            if (op == "append_dcw") return r.layer.append_dcw(rows);
            if (op == "append_rows_dc") return r.layer.append_rows_dc(rows);
            if (op == "append_rows_dcw") return r.layer.append_rows_dcw(rows);
            refuse("append_op", "unknown operation '", op, "'");
          },
          nb::arg("op"), nb::arg("k"), nb::arg("v"), nb::arg("n"), nb::arg("dtype"))
      .def(
          "inc_seqlen", [](RefLayer& r, int t) { r.layer.inc_seqlen(t); }, nb::arg("t"))
      .def(
          "account_steps", [](RefLayer& r, std::int64_t k) { r.layer.account_steps(k); },
          nb::arg("k"))
      .def(
          "rewind", [](RefLayer& r, std::int64_t n) { r.layer.rewind(n); }, nb::arg("new_len"))
      .def(
          "reserve", [](RefLayer& r, std::int64_t k) { r.layer.reserve(k); }, nb::arg("k"))
      .def("can_rewind_to",
           [](const RefLayer& r, std::int64_t p) { return r.layer.can_rewind_to(p); })
      .def("physical_rows", [](const RefLayer& r, std::int64_t s,
                               std::int64_t e) { return r.layer.physical_rows(s, e); })
      .def("view", [](const RefLayer& r) { return r.layer.view(); })
      .def("verify_views",
           [](const RefLayer& r, int t) {
             Views out;
             for (const DecodeView& v : r.layer.verify_views(t))
               out.emplace_back(v.begin, v.end, v.base);
             return out;
           })
      .def(
          "decode",
          [](const RefLayer& r, HostFloats q, std::optional<float> scale) {
            std::vector<double> out;
            {
              nb::gil_scoped_release unlocked;
              out = r.layer.decode(span_of(q), r.n_q_heads, scale);
            }
            return decode_output(std::move(out), r);
          },
          nb::arg("q"), nb::arg("scale").none())
      .def(
          "decode_dc",
          [](RefLayer& r, HostFloats q, std::optional<float> scale) {
            return maybe(r.layer.decode_dc(span_of(q), r.n_q_heads, scale), r);
          },
          nb::arg("q"), nb::arg("scale").none())
      .def(
          "decode_dcw",
          [](RefLayer& r, HostFloats q, std::optional<float> scale) {
            return maybe(r.layer.decode_dcw(span_of(q), r.n_q_heads, scale), r);
          },
          nb::arg("q"), nb::arg("scale").none())
      .def(
          "decode_rows",
          [](const RefLayer& r, HostFloats q, int t, std::optional<float> scale) {
            std::vector<double> out;
            {
              nb::gil_scoped_release unlocked;
              out = r.layer.decode_rows(span_of(q), r.n_q_heads, t, scale);
            }
            return rows_output(std::move(out), r, t);
          },
          nb::arg("q"), nb::arg("t"), nb::arg("scale").none())
      .def(
          "decode_rows_dc",
          [](RefLayer& r, HostFloats q, int t, std::optional<float> scale) {
            return maybe_rows(r.layer.decode_rows_dc(span_of(q), r.n_q_heads, t, scale), r, t);
          },
          nb::arg("q"), nb::arg("t"), nb::arg("scale").none())
      .def(
          "decode_rows_dcw",
          [](RefLayer& r, HostFloats q, int t, std::optional<float> scale) {
            return maybe_rows(r.layer.decode_rows_dcw(span_of(q), r.n_q_heads, t, scale), r, t);
          },
          nb::arg("q"), nb::arg("t"), nb::arg("scale").none())
      .def("snapshot", [](const RefLayer& r) { return r.layer.snapshot(); })
      .def(
          "restore", [](RefLayer& r, const Snapshot& s) { r.layer.restore(s); },
          nb::arg("snapshot"))
      .def_prop_ro("fresh", [](const RefLayer& r) { return r.layer.fresh(); })
      .def("status", [](const RefLayer& r) { return r.layer.status(); })
      .def("clear_status", [](RefLayer& r) { r.layer.clear_status(); })
      .def_prop_ro("len", [](const RefLayer& r) { return r.layer.len(); })
      .def_prop_ro("base", [](const RefLayer& r) { return r.layer.base(); })
      .def_prop_ro("len_d", [](const RefLayer& r) { return r.layer.len_d(); })
      .def_prop_ro("base_d", [](const RefLayer& r) { return r.layer.base_d(); })
      .def_prop_ro("rows", [](const RefLayer& r) { return r.layer.rows(); })
      .def_prop_ro("max_verify", [](const RefLayer& r) { return r.layer.max_verify(); })
      .def_prop_ro("n_q_heads", [](const RefLayer& r) { return r.n_q_heads; })
      .def_prop_ro("geometry", [](const RefLayer& r) { return r.layer.geometry(); })
      // The planes never move after construction (ref::KvLayer sizes them once): a live
      // read-only view, kept valid by the layer it references.
      .def_prop_ro("k_plane",
                   [](const RefLayer& r) {
                     const Geometry& g = r.layer.geometry();
                     return view_numpy(r.layer.k_plane().data(),
                                       {std::size_t(g.rows()), std::size_t(g.k_tok_bytes())},
                                       nb::find(r));
                   })
      .def_prop_ro("v_plane",
                   [](const RefLayer& r) {
                     const Geometry& g = r.layer.geometry();
                     return view_numpy(r.layer.v_plane().data(),
                                       {std::size_t(g.rows()), std::size_t(g.v_tok_bytes())},
                                       nb::find(r));
                   })
      .def(
          "decode_bound",
          [](const RefLayer& r, HostFloats q, const AccumulationShape& shape,
             std::optional<float> scale, std::int64_t begin, std::int64_t end, std::int64_t base) {
            check_bound_query(r, q.size(), "decode_bound");
            const DecodeView view{begin, end, base};
            check_view(r.layer, view);
            PyDecodeBound b;
            {
              nb::gil_scoped_release unlocked;
              b.b = ref::decode_bound(r.layer, span_of(q), r.n_q_heads, scale, view, shape);
            }
            b.shape = {std::size_t(r.n_q_heads), std::size_t(r.layer.geometry().head_dim_v)};
            return b;
          },
          nb::arg("q"), nb::arg("shape"), nb::arg("scale").none(), nb::arg("begin"), nb::arg("end"),
          nb::arg("base"))
      .def(
          "decode_rows_bound",
          [](const RefLayer& r, HostFloats q, const AccumulationShape& shape,
             std::optional<float> scale, const Views& views) {
            std::vector<DecodeView> vs;
            for (const auto& [b, e, base] : views) {
              vs.push_back(DecodeView{b, e, base});
              check_view(r.layer, vs.back());
            }
            PyDecodeBound out;
            {
              nb::gil_scoped_release unlocked;
              // One DecodeBound per row; concatenated in row order (element i of row t at
              // t · n_q_heads · head_dim_v + i), as the verify decode's output is laid out.
              for (ref::DecodeBound& row :
                   ref::decode_rows_bound(r.layer, span_of(q), r.n_q_heads, scale, vs, shape)) {
                for (auto [to, from] :
                     {std::pair{&out.b.bound, &row.bound}, std::pair{&out.b.exact_q, &row.exact_q},
                      std::pair{&out.b.max_abs_v, &row.max_abs_v},
                      std::pair{&out.b.rounded, &row.rounded},
                      std::pair{&out.b.convex_reach, &row.convex_reach},
                      std::pair{&out.b.expected, &row.expected},
                      std::pair{&out.b.sigma, &row.sigma}})
                  to->insert(to->end(), from->begin(), from->end());
              }
            }
            out.shape = {vs.size(), std::size_t(r.n_q_heads),
                         std::size_t(r.layer.geometry().head_dim_v)};
            return out;
          },
          nb::arg("q"), nb::arg("shape"), nb::arg("scale").none(), nb::arg("views"));

  nb::class_<PyDecodeBound>(
      m, "DecodeBound",
      "The per-element bound on |GPU - float64 reference| of a decode (SPEC §8; "
      "kvlayer/reference/accuracy.hpp), as read-only float64 arrays of the output's shape.")
      .def_prop_ro(
          "bound", [](const PyDecodeBound& b) { return bound_array(b, b.b.bound); },
          "the bound on |GPU - reference|")
      .def_prop_ro(
          "exact_q", [](const PyDecodeBound& b) { return bound_array(b, b.b.exact_q); },
          "e_q = |o~ - o|: the fp16(q) effect, computed exactly")
      .def_prop_ro("max_abs_v",
                   [](const PyDecodeBound& b) { return bound_array(b, b.b.max_abs_v); })
      .def_prop_ro(
          "rounded", [](const PyDecodeBound& b) { return bound_array(b, b.b.rounded); },
          "o~: the float64 decode of fp16(q), what the GPU approximates")
      .def_prop_ro("convex_reach",
                   [](const PyDecodeBound& b) { return bound_array(b, b.b.convex_reach); })
      .def_prop_ro(
          "expected", [](const PyDecodeBound& b) { return bound_array(b, b.b.expected); },
          "the declared statistical check's centre: o~ with V as the kernels multiply it "
          "(kvlayer/accuracy.hpp, noise model (N0))")
      .def_prop_ro(
          "sigma", [](const PyDecodeBound& b) { return bound_array(b, b.b.sigma); },
          "the RMS of a correct GPU's scatter around expected ((N1)-(N4)); the check fails a "
          "row whose mean of ((GPU - expected) / sigma)^2 reaches 16")
      .def_prop_ro("shape", [](const PyDecodeBound& b) {
        nb::list l;
        for (std::size_t s : b.shape) l.append(s);
        return nb::tuple(l);
      });

  nb::class_<ref::BoundTightness>(
      m, "BoundTightness",
      "How tight the bound was over many compared elements (SPEC §10.6): record() each "
      "comparison, then summary().")
      .def(nb::init<>())
      .def(
          "record",
          [](ref::BoundTightness& t, nb::ndarray<const double, nb::c_contig, nb::device::cpu> got,
             const PyDecodeBound& b) {
            if (got.size() != b.b.bound.size())
              refuse("BoundTightness.record", "got has ", got.size(), " values, the bound ",
                     b.b.bound.size());
            // A NaN reference (a bad block in the view) is skipped, as the C++ suites do.
            for (std::size_t i = 0; i < got.size(); ++i) {
              if (std::isnan(b.b.rounded[i]))
                t.skip();
              else
                t.record(got.data()[i], b.b, i);
            }
          },
          nb::arg("got"), nb::arg("bound"))
      .def_prop_ro("elements", &ref::BoundTightness::elements)
      .def_prop_ro("skipped", &ref::BoundTightness::skipped)
      .def_prop_ro("vacuous", &ref::BoundTightness::vacuous)
      .def("resolution", &ref::BoundTightness::resolution, nb::arg("q"))
      .def("summary", &ref::BoundTightness::summary);

  m.def("default_scale", &ref::default_scale, nb::arg("head_dim_k"),
        "1/sqrt(head_dim_k) computed in f32: the scale of a decode given none");
}

}  // namespace kvlayer::python
