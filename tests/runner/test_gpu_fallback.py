"""A GPU that runs out of memory at load: which layer counts the model process tries, and what in
llama.cpp's log counts as running out of memory (the load itself on a Vulkan device: test_vulkan_service.py)."""

from __future__ import annotations

from lmsp_tray.runner.model import fewer_layers, out_of_memory


def test_fewer_layers_then_the_cpu() -> None:
    assert fewer_layers(33) == [33, 16, 8, 0]
    assert fewer_layers(5) == [5, 2, 1, 0]
    assert fewer_layers(3) == [3, 1, 0]
    assert fewer_layers(1) == [1, 0]
    assert fewer_layers(0) == [0]


def test_out_of_memory_is_read_from_llama_cpps_log() -> None:
    said = [
        "alloc_tensor_range: failed to allocate Vulkan0 buffer of size 42649600",
        "llama_model_load: error loading model: unable to allocate Vulkan0 buffer",
    ]
    assert out_of_memory(said) == said[0]
    assert out_of_memory(["ggml_cuda_host_malloc: CUDA error: out of memory"]) is not None
    assert out_of_memory(
        ["llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers"]
    )
    assert (
        out_of_memory(["llama_model_load: error loading model: tensor 'blk.0.ffn_up.weight' has wrong shape"]) is None
    )
    assert out_of_memory([]) is None
