"""kvlayer: an LLM's KV cache on the GPU as ggml q8_0 (K) and q5_1 (V) blocks, and its CPU
reference.

* kvlayer.KvLayer: the CUDA layer over PyTorch tensors, on the current torch CUDA stream,
  capturable in torch.cuda.graph (its device-counter calls);
* kvlayer.reference.KvLayer: the reference layer (the executable specification) over NumPy, and
  kvlayer.reference.decode_bound: the accuracy bound of a GPU decode;
* quantize_q8_0, quantize_q5_1, dequantize_q8_0, dequantize_q5_1: the block formats for NumPy;
* Snapshot, save_snapshot, load_snapshot: a layer's rows as a GGUF file;
* Error: every refusal and failure, with the library's message and a .kind.

The CUDA part imports everywhere; constructing kvlayer.KvLayer where it cannot run raises
kvlayer.Error (kind "unavailable") saying why (cuda_unavailable_reason()).
"""

from ._errors import Error

Error.__module__ = "kvlayer"  # tracebacks name it kvlayer.Error, as it is imported
from . import _kvlayer
from ._kvlayer import (
    AccumulationShape,
    BoundTightness,
    DataError,
    DecodeBound,
    DeviceError,
    Geometry,
    LayerStatus,
    Snapshot,
    default_scale,
    load_snapshot,
    save_snapshot,
)
from ._quant import (
    dequantize_q5_1,
    dequantize_q8_0,
    from_bf16_bits,
    quantize_q5_1,
    quantize_q8_0,
    to_bf16_bits,
)
from . import reference
from ._gpu import KvLayer, cuda_available, cuda_unavailable_reason

__version__ = "0.1.0"

#: Whether this build holds the CUDA layer (nvcc was found when it was built).
cuda_built = _kvlayer.cuda_built
#: The head dims kvlayer.KvLayer takes (cuda::kSupportedHeadDims; empty without the CUDA layer).
cuda_head_dims = _kvlayer.cuda_head_dims

__all__ = [
    "AccumulationShape", "BoundTightness", "DataError", "DecodeBound", "DeviceError", "Error",
    "Geometry", "KvLayer", "LayerStatus", "Snapshot", "cuda_available", "cuda_built",
    "cuda_head_dims", "cuda_unavailable_reason", "default_scale", "dequantize_q5_1",
    "dequantize_q8_0", "from_bf16_bits", "load_snapshot", "quantize_q5_1", "quantize_q8_0",
    "reference", "save_snapshot", "to_bf16_bits",
]
