"""Provider choice and provider health, testable without a GPU."""

import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper

import ortlite
from ortlite.session import ProviderUnavailable, create_session, provider_problem, resolve_providers

CUDA_WORKS = torch.cuda.is_available() and provider_problem("CUDAExecutionProvider") is None


def relu_model() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10).SerializeToString()


def test_provider_order_preferred_then_device_then_default():
    options = ortlite.Options(providers=[("TensorrtExecutionProvider", {"trt_fp16_enable": True})])
    chosen = resolve_providers(options, {torch.device("cuda", 1)})
    assert [name for name, _ in chosen] == ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert dict(chosen[0][1]) == {"trt_fp16_enable": "True"}
    assert dict(chosen[1][1]) == {"device_id": "1"}
    no_infer = ortlite.Options(infer_providers=False)
    assert [n for n, _ in resolve_providers(no_infer, {torch.device("cuda", 0)})] == ["CPUExecutionProvider"]


def test_cuda_options_pass_through_first_wins():
    options = ortlite.Options(providers=[("CUDAExecutionProvider", {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"})])
    chosen = dict(resolve_providers(options, {torch.device("cuda", 0)}))
    assert dict(chosen["CUDAExecutionProvider"]) == {"device_id": "0", "arena_extend_strategy": "kSameAsRequested"}


@pytest.mark.skipif(CUDA_WORKS, reason="checks the report when the CUDA provider cannot load; here it can")
def test_cuda_graph_without_a_loadable_cuda_provider_names_the_cause():
    devices = {torch.device("cuda", 0)}
    with pytest.raises(ProviderUnavailable, match=r"cuda:0.*CUDAExecutionProvider (is not in this onnxruntime build|cannot be loaded: \S+)"):
        create_session(relu_model(), ortlite.Options(), resolve_providers(ortlite.Options(), devices), devices)


@pytest.mark.skipif(CUDA_WORKS, reason="checks the report when the CUDA provider cannot load; here it can")
def test_preferred_provider_that_cannot_load_is_skipped_with_a_warning(ortlite_log):
    options = ortlite.Options(providers=["CUDAExecutionProvider"])
    devices = {torch.device("cpu")}
    sess = create_session(relu_model(), options, resolve_providers(options, devices), devices)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert any("CUDAExecutionProvider" in r.message for r in ortlite_log.records)


def test_provider_problem_for_a_provider_not_in_the_build():
    assert "not in this onnxruntime build" in provider_problem("NoSuchExecutionProvider")
    assert provider_problem("CPUExecutionProvider") is None
    assert "CPUExecutionProvider" in onnxruntime.get_available_providers()
    assert isinstance(onnx.load_from_string(relu_model()), onnx.ModelProto)
