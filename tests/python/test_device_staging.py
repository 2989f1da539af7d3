"""CUDA tensors on host-only backends from Python: the Context says whether it stages them through pinned host memory
(a build with CUDA), and a CUDA task reaches the engine with its device and ready event. Debian's torch has no CUDA,
so the GPU half (torch.cuda events, real copies) runs only in scripts/gpu_checks.sh's C++ tests."""
import array

import pytest
import torch

from commsched import _C


def test_host_only_backend_stages_cuda_tensors_exactly_when_cuda_is_built():
    ctx = _C.Context(backend="loopback")
    try:
        assert ctx.stages_device_copies == bool(_C.build["cuda"])
    finally:
        ctx.shutdown()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU is present: the C++ CUDA tests cover this path")
def test_cuda_task_without_a_gpu_fails_naming_the_tensor_or_is_refused():
    ctx = _C.Context(backend="loopback")
    host = array.array("f", [1.0] * 16)  # host memory labelled as CUDA: there is no device to copy from
    address = host.buffer_info()[0]
    try:
        if not _C.build["cuda"]:
            with pytest.raises(ValueError, match="'fake.cuda'.*device-copy stage"):
                ctx.submit("fake.cuda", 0, "reduce", "f32", address, 16, device="cuda")
            return
        handle = ctx.submit("fake.cuda", 0, "reduce", "f32", address, 16, device="cuda", ready_event=0)
        assert handle.wait(30.0), "the task hung"
        assert handle.error is not None
        assert "fake.cuda" in handle.error and "device_copy" in handle.error and "cuda" in handle.error
    finally:
        ctx.shutdown()
