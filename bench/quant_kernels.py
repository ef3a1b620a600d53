"""ONNX Runtime's integer matmul kernels against float32 MatMul, one node each with a
constant weight, 1 thread, pre-bound I/O, rounds interleaved, medians (how
ortlite.lower.quantize chose its kernels).

    python bench/quant_kernels.py [--rounds 5] [--rows 1,128] [--shapes 512x512,512x2048,2048x512] [--only NAME,...]

Candidates: DynamicQuantizeMatMul (int8 per channel), DynamicQuantizeLinear + MatMulInteger +
Cast + Mul, DynamicQuantizeLinear + MatMulIntegerToFloat (int8 weights, and ortlite's uint8
weights at zero point 128), MatMulNBits 8 and 4 bits at
several block sizes and accuracy levels (4: int8 compute, 1: float32).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
NBITS = [(8, 32, 4), (8, 128, 4), (8, 32, 1), (4, 32, 4), (4, 64, 4), (4, 128, 4), (4, 32, 1)]


def _model(nodes, weights: dict, k, n, rows) -> bytes:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [rows, k])], [helper.make_tensor_value_info("y", F, [rows, n])],
        [numpy_helper.from_array(v, name) for name, v in weights.items()],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, ir_version=10, opset_imports=opsets).SerializeToString()


def _int8(w):
    scale = (np.abs(w).max(0) / 127).astype(np.float32)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


def _nbits(w, bits, block):
    k, n = w.shape
    blocks = -(-k // block)
    padded = np.zeros((n, blocks * block), np.float32)
    padded[:, :k] = w.T
    padded = padded.reshape(n, blocks, block)
    half = 2 ** (bits - 1)
    scale = np.abs(padded).max(-1) / (half - 1)
    codes = (np.clip(np.rint(padded / scale[..., None]), -half, half - 1) + half).astype(np.uint8)
    if bits == 4:
        codes = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return codes, scale.astype(np.float32)


def variants(k, n, rows, rng):
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    q, s = _int8(w)
    ms = "com.microsoft"
    yield "f32 MatMul", _model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"w": w}, k, n, rows)
    yield "DynamicQuantizeMatMul", _model([helper.make_node("DynamicQuantizeMatMul", ["x", "q", "s"], ["y"], domain=ms)], {"q": q, "s": s}, k, n, rows)
    quantize_x = helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"])
    yield "MatMulInteger+Mul", _model(
        [
            quantize_x,
            helper.make_node("MatMulInteger", ["xq", "q", "xz"], ["acc"]),
            helper.make_node("Cast", ["acc"], ["accf"], to=F),
            helper.make_node("Mul", ["xs", "s"], ["sc"]),
            helper.make_node("Mul", ["accf", "sc"], ["y"]),
        ],
        {"q": q, "s": s}, k, n, rows,
    )  # fmt: skip
    yield "MatMulIntegerToFloat", _model(
        [quantize_x, helper.make_node("MatMulIntegerToFloat", ["xq", "q", "xs", "s", "xz"], ["y"], domain=ms)], {"q": q, "s": s}, k, n, rows
    )
    # ortlite's form: the same codes as uint8 at zero point 128 (MLAS's u8 x u8 kernel, exact on
    # every CPU; u8 x s8 saturates on plain AVX2: ortlite.lower.quantize)
    unsigned = {"q": (q.astype(np.int16) + 128).astype(np.uint8), "s": s, "qz": np.array(128, np.uint8)}
    yield "MatMulIntegerToFloat u8u8", _model(
        [quantize_x, helper.make_node("MatMulIntegerToFloat", ["xq", "q", "xs", "s", "xz", "qz"], ["y"], domain=ms)], unsigned, k, n, rows
    )
    for bits, block, level in NBITS:
        b, scale = _nbits(w, bits, block)
        node = helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain=ms, K=k, N=n, bits=bits, block_size=block, accuracy_level=level)
        yield f"MatMulNBits {bits}b blk{block} acc{level}", _model([node], {"b": b, "s": scale}, k, n, rows)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", default="1,128")
    parser.add_argument("--shapes", default="512x512,512x2048,2048x512")
    parser.add_argument("--only", default="", help="comma-separated candidate names (f32 MatMul always runs)")
    args = parser.parse_args()
    only = {s for s in args.only.split(",") if s}
    rng = np.random.default_rng(0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 3
    print(f"onnxruntime {ort.__version__}, 1 thread; time per call, x float32 MatMul")
    for shape in args.shapes.split(","):
        k, n = map(int, shape.split("x"))
        for rows in map(int, args.rows.split(",")):
            x = rng.standard_normal((rows, k)).astype(np.float32)
            bound = {}
            for name, model in variants(k, n, rows, rng):
                if only and name not in only and name != "f32 MatMul":
                    continue
                sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
                io = sess.io_binding()
                io.bind_cpu_input("x", x)
                io.bind_output("y")
                sess.run_with_iobinding(io)
                bound[name] = (sess, io)
            iters = max(3, int(2000 / (k * n * rows / 1e6 * 3 + 20)))
            samples = {name: [] for name in bound}
            for _ in range(args.rounds):
                for name, (sess, io) in bound.items():
                    start = time.perf_counter()
                    for _ in range(iters):
                        sess.run_with_iobinding(io)
                    samples[name].append((time.perf_counter() - start) / iters * 1e6)
            base = statistics.median(samples["f32 MatMul"])
            print(f"K={k} N={n} rows={rows}")
            for name, values in samples.items():
                median = statistics.median(values)
                print(f"  {name:32} {median:9.1f} us  {median / base:5.2f}x")


if __name__ == "__main__":
    main()
