"""The package itself: it imports on any machine, kvlayer.Error carries the library's message
and kind, and a GPU layer that cannot run here says why."""

import pickle

import pytest

import kvlayer
import kvlayer.reference as kref


def test_error_is_a_runtime_error_with_the_librarys_message_and_kind():
    with pytest.raises(RuntimeError) as info:
        kref.KvLayer(1, 64, 10, 1).rewind(3)
    e = info.value
    assert isinstance(e, kvlayer.Error) and e.kind == "refused"
    assert str(e) == "rewind: new_len 3 is outside [0, len 0]"
    copy = pickle.loads(pickle.dumps(e))
    assert (type(copy), str(copy), copy.kind) == (kvlayer.Error, str(e), "refused")


def test_io_errors_have_kind_io(tmp_path):
    with pytest.raises(kvlayer.Error) as info:
        kvlayer.load_snapshot(str(tmp_path / "missing.gguf"))
    assert info.value.kind == "io"
    assert str(info.value).startswith(f"load_snapshot: {tmp_path / 'missing.gguf'}: ")


def test_the_gpu_layer_says_clearly_why_it_cannot_run_here():
    reason = kvlayer.cuda_unavailable_reason()
    if reason is None:
        pytest.skip("a CUDA device is visible: the GPU layer is available (test_gpu.py runs it)")
    assert not kvlayer.cuda_available()
    with pytest.raises(kvlayer.Error) as info:
        kvlayer.KvLayer(8, 128, 4096, 32)
    assert info.value.kind == "unavailable"
    assert str(info.value) == "kvlayer.KvLayer: the CUDA layer is unavailable: " + reason
    if kvlayer.cuda_built:
        assert reason.startswith("no CUDA device is visible (cudaGetDeviceCount: ")
    else:
        assert reason.startswith("this kvlayer was built without its CUDA layer")


def test_geometry_is_plain_data_validated_by_the_library():
    g = kvlayer.Geometry()
    g.n_kv_heads, g.head_dim_k, g.head_dim_v, g.max_ctx = 2, 64, 64, 100
    g.window = 10
    g.validate()
    assert g.describe() == "flat 2x64/64 max_ctx 100 window 10" and g.rows == 100
    g.window = None
    g.max_ctx = 0
    with pytest.raises(kvlayer.Error) as info:
        g.validate()
    assert str(info.value).startswith("geometry: max_ctx 0")


def test_the_gpu_layers_own_refusals_that_need_no_gpu():
    """The checks kvlayer.KvLayer makes before the library sees a pointer, device or stream."""
    import numpy as np

    from kvlayer import _gpu

    from conftest import refusal

    assert refusal(_gpu._buffer, "append", "k", np.zeros((2, 64), np.float32), 0) == (
        "append: k is a ndarray, not a CUDA tensor (a torch.Tensor on the layer's device, or an "
        "object with __cuda_array_interface__)")

    class Strided:  # a CUDA array interface of a transposed view
        __cuda_array_interface__ = {"data": (0, False), "shape": (4, 8), "typestr": "<f4",
                                    "strides": (4, 16), "version": 3}

    assert refusal(_gpu._buffer, "decode", "q", Strided(), 0) == \
        "decode: q is not contiguous (strides (4, 16))"
    assert refusal(_gpu._device_index, "gpu:0") == \
        "kvlayer.KvLayer: device 'gpu:0' is not 'cuda' or 'cuda:N'"
    assert refusal(_gpu._stream_value, "default") == (
        "kvlayer.KvLayer: stream 'default' is not an int handle, a torch.cuda.Stream or a CuPy "
        "stream")

    class TorchStreamLike:
        cuda_stream = 1234

    assert _gpu._stream_value(TorchStreamLike()) == 1234


def test_the_cuda_head_dims_come_from_the_library_table():
    dims = kvlayer.cuda_head_dims
    assert isinstance(dims, tuple)
    if not kvlayer.cuda_built:
        assert dims == ()
        return
    # cuda::kSupportedHeadDims: ascending, whole q8_0/q5_1 blocks of 32 values
    assert dims and list(dims) == sorted(set(dims)) and all(d % 32 == 0 for d in dims)
