"""Would quantized convolutions pay? ONNX Runtime's integer convolutions against float32 Conv,
one node each with a constant weight, on ResNet and MobileNet layer shapes, 1 thread, rounds
interleaved, medians (why Options(quantize=...) leaves convolutions in float32).

    python bench/quant_convs.py [--rounds 5]

Candidates: "dynamic int8" is what quantize does for products (activations quantized per
call: DynamicQuantizeLinear + ConvInteger, the int32 sum scaled back and the bias added);
"QLinearConv" is static quantization (activation and output scales fixed in the file, which
needs calibration data ortlite does not have), shown for what it would give.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
LAYERS = {  # name: (in channels, out channels, kernel, height = width, groups)
    "resnet 3x3 64ch 56px": (64, 64, 3, 56, 1),
    "resnet 3x3 256ch 14px": (256, 256, 3, 14, 1),
    "resnet 1x1 256->64 56px": (256, 64, 1, 56, 1),
    "resnet 1x1 1024->256 14px": (1024, 256, 1, 14, 1),
    "mobilenet dw 3x3 144ch 56px": (144, 144, 3, 56, 144),
    "mobilenet 1x1 24->144 56px": (24, 144, 1, 56, 1),
    "mobilenet 1x1 576->96 14px": (576, 96, 1, 14, 1),
}


def _model(nodes, weights: dict, cin, hw) -> ort.InferenceSession:
    inits = [numpy_helper.from_array(v, name) for name, v in weights.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, cin, hw, hw])], [helper.make_tensor_value_info("y", F, None)], inits)
    model = helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def candidates(cin, cout, k, hw, groups, rng) -> dict:
    w = (rng.standard_normal((cout, cin // groups, k, k)) * 0.1).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    scale = (np.abs(w).reshape(cout, -1).max(1) / 127).astype(np.float32)
    q = np.clip(np.rint(w / scale[:, None, None, None]), -127, 127).astype(np.int8)
    conv = dict(pads=[k // 2] * 4, group=groups)
    f32 = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **conv)], {"w": w, "b": b}, cin, hw)
    dynamic = _model(
        [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
            helper.make_node("ConvInteger", ["xq", "wq", "xz"], ["acc"], **conv),
            helper.make_node("Cast", ["acc"], ["accf"], to=F),
            helper.make_node("Mul", ["xs", "ws"], ["s"]),
            helper.make_node("Mul", ["accf", "s"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["y"]),
        ],
        {"wq": q, "ws": scale.reshape(1, cout, 1, 1), "b": b.reshape(1, cout, 1, 1)}, cin, hw,
    )  # fmt: skip
    static = _model(
        [
            helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
            helper.make_node("QLinearConv", ["xq", "xs", "xz", "wq", "ws", "wz", "ys", "yz", "bq"], ["yq"], **conv),
            helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
        ],
        {"wq": q, "ws": scale, "wz": np.zeros(cout, np.int8), "xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8),
         "ys": np.array(0.1, np.float32), "yz": np.array(128, np.uint8), "bq": np.zeros(cout, np.int32)}, cin, hw,
    )  # fmt: skip
    return {"float32 Conv": f32, "dynamic int8": dynamic, "QLinearConv": static}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"onnxruntime {ort.__version__}, 1 thread, ms per node (median of {args.rounds} interleaved rounds of {args.iters} runs)")
    print("| layer | float32 Conv | dynamic int8 (× f32) | QLinearConv, static (× f32) |")
    print("|---|---|---|---|")
    for name, (cin, cout, k, hw, groups) in LAYERS.items():
        sessions = candidates(cin, cout, k, hw, groups, rng)
        feed = {"x": rng.standard_normal((1, cin, hw, hw)).astype(np.float32)}
        times = {c: [] for c in sessions}
        for s in sessions.values():
            s.run(None, feed)
        for _ in range(args.rounds):
            for c, s in sessions.items():
                start = time.perf_counter()
                for _ in range(args.iters):
                    s.run(None, feed)
                times[c].append((time.perf_counter() - start) / args.iters * 1e3)
        ms = {c: statistics.median(t) for c, t in times.items()}
        f32 = ms["float32 Conv"]
        print(f"| {name} | {f32:.3f} | {ms['dynamic int8']:.3f} ({ms['dynamic int8'] / f32:.2f}) | {ms['QLinearConv']:.3f} ({ms['QLinearConv'] / f32:.2f}) |")


if __name__ == "__main__":
    main()
