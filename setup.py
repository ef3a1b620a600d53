import os

from Cython.Build import cythonize
from setuptools import Extension, setup

# The ONNX Runtime wheel: onnxruntime-gpu by default (it runs the CPU provider too);
# ORTLITE_ORT_PACKAGE=onnxruntime selects the CPU-only wheel. Both provide the same
# `onnxruntime` module and must not be installed together.
ORT_PACKAGE = os.environ.get("ORTLITE_ORT_PACKAGE", "onnxruntime-gpu")

extensions = [Extension("ortlite._fast", ["ortlite/_fast.pyx"], extra_compile_args=["-O2"])]

setup(
    # torch: tested on 2.13; the aot_autograd / torch.export APIs used need >= 2.9.
    install_requires=["torch>=2.9,<2.15", "onnx>=1.16", "numpy", f"{ORT_PACKAGE}>=1.18"],
    extras_require={
        # pytest < 9.2: pytest-xdist 3.8 sets item._nodeid, which 9.2 no longer reads, so its
        # xdist_group marks were silently ignored (two Ray clusters, two DDP process groups)
        "test": ["pytest<9.2", "pytest-xdist", "transformers", "expecttest", "hypothesis", "ray[serve]", "tritonclient[http]"],  # tritonclient.grpc: ray[serve]'s grpcio and protobuf ([grpc] pins protobuf<7)
        # ortlite.serve: a saved model behind Ray Serve (docs/serving.md)
        "serve": ["ray[serve]"],
        # peers the benchmarks compare with; never needed at run time
        "bench": ["transformers", "onnxscript"],
    },
    ext_modules=cythonize(
        extensions,
        language_level=3,
        compiler_directives={"boundscheck": False, "wraparound": False, "embedsignature": True},
    ),
)
