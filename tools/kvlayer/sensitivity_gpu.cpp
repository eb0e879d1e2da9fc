#include "sensitivity_gpu.hpp"

#include <cstring>

#include "kvlayer/cuda/kv_layer.hpp"
#include "kvlayer/cuda/runtime.hpp"
#include "kvlayer/error.hpp"

namespace kvlayer::cli {

struct GpuDecode::Impl {
  Impl(const Geometry& geometry, int heads, int max_verify)
      : g(geometry), n_q_heads(heads), layer(g, heads, stream.get(), max_verify) {}
  Geometry g;
  int n_q_heads;
  cuda::Stream stream;  // before the layer, which holds it
  cuda::KvLayer layer;
};

GpuDecode::GpuDecode(const Geometry& g, int n_q_heads, int max_verify)
    : impl_(std::make_unique<Impl>(g, n_q_heads, max_verify)) {}

GpuDecode::~GpuDecode() = default;

void GpuDecode::append(const float* k, const float* v, std::int64_t n) {
  const Geometry& g = impl_->g;
  const std::size_t kb = std::size_t(n * g.kv_dim_k()) * sizeof(float);
  const std::size_t vb = std::size_t(n * g.kv_dim_v()) * sizeof(float);
  cuda::DeviceBuffer dk(kb), dv(vb);
  KVLAYER_CUDA_TRY(cudaMemcpyAsync(dk.get(), k, kb, cudaMemcpyHostToDevice, impl_->stream.get()));
  KVLAYER_CUDA_TRY(cudaMemcpyAsync(dv.get(), v, vb, cudaMemcpyHostToDevice, impl_->stream.get()));
  impl_->layer.append(cuda::RowsView{dk.get(), dv.get(), n, DType::f32});
  // The buffers go out of scope: the append must have read them.
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(impl_->stream.get()));
}

std::vector<float> GpuDecode::decode_rows(std::span<const float> q, int t) {
  const Geometry& g = impl_->g;
  const std::size_t out_values =
      std::size_t(t) * std::size_t(impl_->n_q_heads) * std::size_t(g.head_dim_v);
  cuda::DeviceBuffer dq(q.size() * sizeof(float)), dout(out_values * sizeof(float));
  KVLAYER_CUDA_TRY(cudaMemcpyAsync(dq.get(), q.data(), q.size() * sizeof(float),
                                   cudaMemcpyHostToDevice, impl_->stream.get()));
  // Poisoned first: an element the kernel does not write cannot pass as an output.
  KVLAYER_CUDA_TRY(
      cudaMemsetAsync(dout.get(), 0xFF, out_values * sizeof(float), impl_->stream.get()));
  if (t == 1)
    impl_->layer.decode(dq.as<float>(), dout.as<float>());
  else
    impl_->layer.decode_rows(dq.as<float>(), dout.as<float>(), t);
  std::vector<float> out(out_values);
  KVLAYER_CUDA_TRY(cudaMemcpyAsync(out.data(), dout.get(), out_values * sizeof(float),
                                   cudaMemcpyDeviceToHost, impl_->stream.get()));
  KVLAYER_CUDA_TRY(cudaStreamSynchronize(impl_->stream.get()));
  if (!impl_->layer.status().ok())
    throw Error(ErrorKind::device,
                "sensitivity: the GPU decode recorded " + impl_->layer.status().message());
  return out;
}

AccumulationShape GpuDecode::accumulation_shape() const {
  return impl_->layer.accumulation_shape();
}

AccumulationShape GpuDecode::verify_accumulation_shape(int t) const {
  return impl_->layer.verify_accumulation_shape(t);
}

}  // namespace kvlayer::cli
