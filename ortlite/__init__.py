"""ortlite: run PyTorch graphs in ONNX Runtime, with little per-call overhead.

    fast = torch.compile(model, backend=ortlite.backend)       # or backend="ortlite"
    be = ortlite.Backend(ortlite.Options(fallback="error")); torch.compile(model, backend=be)
    compiled = ortlite.compile(model, (example_input,))        # ahead of time, via torch.export
    compiled.save("model.onnx"); compiled = ortlite.load("model.onnx")   # no torch.export, no model code
    print(ortlite.explain(model, example_input))               # what runs in ONNX Runtime, what in torch, why
"""

from ._fast import RunError
from .aot import CompileError, compile
from .compiled import CompiledModel
from .dynamo_backend import Backend, GraphReport, Stats, UnsupportedError
from .explain import Explanation, explain
from .options import Options
from .loading import load

backend = Backend()
"""The default backend. torch.compile(..., options={...}) routes to a cached Backend for those options."""

__all__ = ["Backend", "CompileError", "CompiledModel", "Explanation", "GraphReport", "Options", "RunError", "Stats", "UnsupportedError", "backend", "compile", "explain", "load"]
__version__ = "0.1.0"
