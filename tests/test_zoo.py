"""A fast subset of bench/zoo.py (the model zoo with changing batch and sequence or image
sizes; `python bench/zoo.py` runs all of it): every call gives eager's result, and each
model runs whole in ONNX Runtime, one session per Dynamo graph, nothing left to torch."""

import os
import sys

import pytest

pytest.importorskip("transformers", reason="the zoo builds transformers models (the test extra)")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import zoo  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
@pytest.mark.parametrize("name", zoo.QUICK)
def test_zoo_model_with_changing_shapes_is_right_and_whole(name, dynamic):
    result = zoo.run_model(name, dynamic)
    assert result["error"] is None, result["error"]
    assert result["matches"] == result["calls"], result["per_call"]
    assert result["fallback_ops"] == {}, result["reasons"]
    assert result["graph_breaks"] == {}, result["graph_breaks"]
    assert result["sessions"] <= result["graphs"], result  # one session per Dynamo graph at most
