#include "kvlayer/golden/check.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <span>
#include <sstream>

#include "kvlayer/error.hpp"
#include "kvlayer/reference/accuracy.hpp"
#include "kvlayer/reference/kv_layer.hpp"

namespace kvlayer::golden {
namespace {

constexpr std::size_t kMaxMessages = 12;

void note(std::vector<std::string>& failures, const std::string& msg) {
  note_failure(failures, msg);
}

std::string hex_bytes(const std::uint8_t* p, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

std::string bits_string(float v) {
  std::ostringstream s;
  s << v << " (0x" << std::hex << std::bit_cast<std::uint32_t>(v) << ")";
  return s.str();
}

/// NaN payloads are not part of the contract (hardware may quiet them), so any NaN matches a
/// NaN; every other value must match bit for bit (this distinguishes -0 from +0).
bool same_value(float got, std::uint32_t want_bits) {
  const float want = std::bit_cast<float>(want_bits);
  if (std::isnan(want)) return std::isnan(got);
  return std::bit_cast<std::uint32_t>(got) == want_bits;
}

const char* type_name(ref::BlockType t) {
  return t == ref::BlockType::q8_0 ? "q8_0" : "q5_1";
}

}  // namespace

LayerState layer_state(const ref::KvLayer& l) {
  return {l.k_plane(), l.v_plane(), l.len(), l.base(), l.len_d(), l.base_d()};
}

double decode_tolerance(double magnitude, double score_magnitude, int head_dim,
                        std::int64_t n_keys) {
  const double u = std::ldexp(1.0, -53);
  const double delta = (2.0 * (head_dim + 1) + 4.0) * u * score_magnitude;
  const double eps_w = std::expm1(delta) + 16.0 * u;
  return 2.0 * (2.0 * eps_w + (4.0 * double(n_keys) + 4.0) * u) * magnitude;
}

QuantCheck check_quant(const QuantCase& c, const QuantFormat& f) {
  QuantCheck r;
  r.case_name = c.name;
  r.type = f.type;
  r.blocks = c.blocks;
  r.bad_expected = std::int64_t(f.bad_blocks.size());
  r.degenerate = std::int64_t(f.degenerate_blocks.size());
  const std::size_t bb = std::size_t(ref::block_bytes(f.type));
  std::size_t next_bad = 0;
  std::vector<std::uint8_t> out(bb);
  for (std::int64_t b = 0; b < c.blocks; ++b) {
    std::span<const float, kBlockValues> in(c.input.data() + b * kBlockValues, kBlockValues);
    const std::optional<float> reported =
        f.type == ref::BlockType::q8_0
            ? ref::quantize_q8_0_block(
                  in, std::span<std::uint8_t, kQ8_0BlockBytes>(out.data(), kQ8_0BlockBytes))
            : ref::quantize_q5_1_block(
                  in, std::span<std::uint8_t, kQ5_1BlockBytes>(out.data(), kQ5_1BlockBytes));
    const std::uint8_t* want = f.expected.data() + std::size_t(b) * bb;
    if (std::memcmp(out.data(), want, bb) != 0) {
      ++r.mismatched_blocks;
      note(r.failures, c.name + " " + type_name(f.type) + " block " + std::to_string(b) +
                           ": reference " + hex_bytes(out.data(), bb) + " != golden " +
                           hex_bytes(want, bb));
    }
    const bool expect_bad = next_bad < f.bad_blocks.size() && f.bad_blocks[next_bad].block == b;
    if (expect_bad != reported.has_value() ||
        (expect_bad && !same_value(*reported, f.bad_blocks[next_bad].value_bits))) {
      ++r.bad_misreported;
      note(r.failures,
           c.name + " " + type_name(f.type) + " block " + std::to_string(b) + ": reference " +
               (reported ? "reports bad value " + bits_string(*reported)
                         : std::string("reports no error")) +
               ", golden " +
               (expect_bad ? "expects bad value " + bits_string(f.bad_blocks[next_bad].value())
                           : std::string("expects none")));
    }
    if (expect_bad) ++next_bad;
  }
  // The row quantizer must agree too, and report the first bad block.
  std::vector<std::uint8_t> row(f.expected.size());
  const auto first = ref::quantize_row(f.type, c.input, row);
  if (row != f.expected) {
    ++r.mismatched_blocks;
    note(r.failures, c.name + " " + type_name(f.type) + ": quantize_row bytes differ from golden");
  }
  const bool want_first = !f.bad_blocks.empty();
  if (want_first != first.has_value() ||
      (first && (first->block != f.bad_blocks[0].block ||
                 !same_value(first->value, f.bad_blocks[0].value_bits)))) {
    ++r.bad_misreported;
    note(
        r.failures,
        c.name + " " + type_name(f.type) + ": quantize_row reports " +
            (first ? "block " + std::to_string(first->block) + " value " + bits_string(first->value)
                   : std::string("no bad block")) +
            ", golden's first bad block is " +
            (want_first ? std::to_string(f.bad_blocks[0].block) : std::string("none")));
  }
  return r;
}

void note_failure(std::vector<std::string>& failures, const std::string& message) {
  if (failures.size() < kMaxMessages)
    failures.push_back(message);
  else if (failures.size() == kMaxMessages)
    failures.push_back("(further failures not listed)");
}

PlaneComparison compare_plane(const std::string& case_name, const char* plane,
                              const std::vector<std::uint8_t>& got,
                              const std::vector<std::uint8_t>& golden, std::int64_t tok_bytes) {
  PlaneComparison p;
  p.bytes = std::int64_t(golden.size());
  if (got.size() != golden.size()) {
    p.mismatches = p.bytes;
    p.failure = case_name + ": " + plane + " plane has " + std::to_string(got.size()) +
                " bytes, golden " + std::to_string(golden.size());
    return p;
  }
  std::int64_t first = -1;
  for (std::size_t b = 0; b < golden.size(); ++b)
    if (got[b] != golden[b]) {
      if (first < 0) first = std::int64_t(b);
      ++p.mismatches;
    }
  if (p.mismatches)
    p.failure = case_name + ": " + plane + " plane: " + std::to_string(p.mismatches) +
                " bytes differ, first at byte " + std::to_string(first) + " (physical row " +
                std::to_string(first / tok_bytes) + ")";
  return p;
}

DecodeCheck check_decode(const DecodeCase& c) {
  DecodeCheck r;
  r.case_name = c.name;
  r.ops = std::int64_t(c.ops.size());
  const int hd = c.head_dim();
  const std::size_t per_op = std::size_t(c.n_q_heads) * std::size_t(hd);
  const std::optional<float> scale =
      c.scale_is_default ? std::nullopt : std::optional<float>(c.scale);
  std::optional<ref::KvLayer> layer;
  try {
    layer.emplace(c.geometry);
  } catch (const Error& e) {
    ++r.op_failures;
    note(r.failures, c.name + ": geometry refused: " + e.what());
    return r;
  }
  if (c.scale_is_default && ref::default_scale(hd) != c.scale)
    note(r.failures, c.name + ": reference default scale " + bits_string(ref::default_scale(hd)) +
                         " != golden " + bits_string(c.scale));

  for (std::size_t i = 0; i < c.ops.size(); ++i) {
    const GoldenOp& op = c.ops[i];
    const std::string where = c.name + " op " + std::to_string(i) + " (" + op.describe() + ")";
    const LayerState before = layer_state(*layer);
    std::string refusal;
    try {
      if (op.kind == GoldenOp::Kind::append)
        layer->append(ref::RowsView{c.k_row(op.src_row), c.v_row(op.src_row), op.n, c.input_dtype});
      else
        layer->rewind(op.to);
    } catch (const Error& e) {
      refusal = e.what();
      if (e.kind() != ErrorKind::refused) {
        ++r.op_failures;
        note(r.failures, where + ": threw a non-refusal error: " + refusal);
      }
    }
    if (op.expect_ok && !refusal.empty()) {
      ++r.op_failures;
      note(r.failures, where + ": refused, golden expects success: " + refusal);
    } else if (!op.expect_ok && refusal.empty()) {
      ++r.op_failures;
      note(r.failures, where + ": accepted, golden expects a refusal");
    } else if (!op.expect_ok && !(layer_state(*layer) == before)) {
      ++r.op_failures;
      note(r.failures, where + ": refused but the state changed");
    }
    if (layer->len() != op.len || layer->base() != op.base || layer->len_d() != op.len ||
        layer->base_d() != op.base) {
      ++r.op_failures;
      note(r.failures, where + ": len/base/len_d/base_d " + std::to_string(layer->len()) + "/" +
                           std::to_string(layer->base()) + "/" + std::to_string(layer->len_d()) +
                           "/" + std::to_string(layer->base_d()) + ", golden len " +
                           std::to_string(op.len) + " base " + std::to_string(op.base));
      continue;  // the decode would compare different views
    }

    ++r.decodes;
    std::vector<double> got;
    try {
      got = layer->decode(c.query, c.n_q_heads, scale);
    } catch (const Error& e) {
      if (op.decode_ok) {
        ++r.op_failures;
        note(r.failures, where + ": decode refused, golden expects an output: " + e.what());
      }
      continue;
    }
    if (!op.decode_ok) {
      ++r.op_failures;
      note(r.failures, where + ": decode accepted, golden expects a refusal (view not resident)");
      continue;
    }
    if (got.size() != per_op) {
      ++r.op_failures;
      note(r.failures, where + ": decode returned " + std::to_string(got.size()) + " values");
      continue;
    }
    const std::int64_t n_keys = c.view_length(i);
    for (std::size_t e = 0; e < per_op; ++e) {
      const double want = c.outputs[i * per_op + e];
      const double tol = decode_tolerance(
          c.magnitudes[i * per_op + e],
          c.score_magnitudes[i * std::size_t(c.n_q_heads) + e / std::size_t(hd)], hd, n_keys);
      ++r.outputs_compared;
      bool ok;
      if (std::isnan(want)) {
        ok = std::isnan(got[e]);
        ++r.nan_outputs;
      } else {
        const double err = std::fabs(got[e] - want);
        ok = err <= tol;  // false for a NaN got[e]
        if (std::isfinite(err)) {
          r.max_abs_error = std::max(r.max_abs_error, err);
          if (tol > 0)
            r.max_error_ratio = std::max(r.max_error_ratio, err / tol);
          else if (err > 0)
            r.max_error_ratio = INFINITY;
        }
      }
      if (!ok) {
        ++r.output_failures;
        std::ostringstream s;
        s.precision(17);
        s << where << ": output head " << e / std::size_t(hd) << " dim " << e % std::size_t(hd)
          << ": reference " << got[e] << ", golden " << want << ", tolerance " << tol;
        note(r.failures, s.str());
      }
    }
  }

  if (layer->len() != c.final_len || layer->base() != c.final_base) {
    ++r.op_failures;
    note(r.failures, c.name + ": final len/base " + std::to_string(layer->len()) + "/" +
                         std::to_string(layer->base()) + ", golden " + std::to_string(c.final_len) +
                         "/" + std::to_string(c.final_base));
  }
  for (auto [name, got, want, tok] :
       {std::tuple{"K", &layer->k_plane(), &c.k_plane, c.geometry.k_tok_bytes()},
        std::tuple{"V", &layer->v_plane(), &c.v_plane, c.geometry.v_tok_bytes()}}) {
    const PlaneComparison p = compare_plane(c.name, name, *got, *want, tok);
    r.plane_bytes += p.bytes;
    r.plane_byte_mismatches += p.mismatches;
    if (p.failure) note(r.failures, *p.failure);
  }
  const auto& de = layer->status().data_error;
  if (c.data_error.has_value() != de.has_value() ||
      (de &&
       (de->row != c.data_error->row || de->plane != c.data_error->plane ||
        de->block != c.data_error->block || !same_value(de->value, c.data_error->value_bits)))) {
    ++r.op_failures;
    note(r.failures,
         c.name + ": data error " + (de ? describe(*de) : std::string("none")) + "; golden: " +
             (c.data_error ? "row " + std::to_string(c.data_error->row) + " plane " +
                                 (c.data_error->plane == Plane::k ? "K" : "V") + " block " +
                                 std::to_string(c.data_error->block) + " value " +
                                 bits_string(std::bit_cast<float>(c.data_error->value_bits))
                           : std::string("none")));
  }
  if (layer->status().device_error) {
    ++r.op_failures;
    note(r.failures, c.name + ": unexpected " + describe(*layer->status().device_error));
  }
  return r;
}

}  // namespace kvlayer::golden
