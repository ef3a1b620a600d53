# cython: language_level=3, boundscheck=False, wraparound=False
"""The per-call hot path: check arguments against the session's input schema, wrap them
by data pointer, allocate outputs, run, and hand results back.

Everything that can be is computed once, when the Runner is built (ortlite/runner.py).
Sessions made through ONNX Runtime's C API (CSession, the default on CPU) run with Run() on
OrtValues over torch's memory; others (CUDA, a user's SessionOptions, or no C library) run
through the pybind module's IOBinding. Either way a call takes a _Binding from a small pool
(one per concurrent caller) holding what it last bound, so only what changed is rewrapped.

One extension module in a few files, by concern (the classes' fields in _fast.pxd):
    hotpath/ort_api.pxi        ONNX Runtime's C API (declared in _ort.pxd): sessions, OrtValues
    hotpath/tensor_access.pxi  torch's tensors read from their C++ objects, checked at import
    hotpath/arguments.pxi      a call's arguments: checked, then bound into a _Binding
    hotpath/runner.pxi         outputs, frozen weights, and the Runner that runs a call
"""

import math
import os
import types
import weakref

from cpython.object cimport PyObject
from cpython.ref cimport Py_REFCNT
from libc.stdint cimport int64_t, uint16_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcmp, memcpy
from posix.dlfcn cimport dlopen, dlsym, dlerror, RTLD_NOW, RTLD_LOCAL

from ortlite._ort cimport *

import torch

cdef object Tensor = torch.Tensor
cdef object empty_like = torch.empty_like
cdef object _Parameter = torch.nn.Parameter
from torch.utils.dlpack import from_dlpack

# Argument kinds and output sources; ortlite/runner.py maps ortlite.lower's names to these.
cdef enum:
    K_TENSOR = 0
    K_INT = 1
    K_FLOAT = 2
    K_BOOL = 3
    K_UNUSED = 4
    K_FROZEN = 5  # a weight that is an initializer of the session: checked, not bound

cdef enum:
    S_ORT = 0
    S_INPUT = 1
    S_CONST = 2
    S_SYM = 3

class RunError(RuntimeError):
    """ONNX Runtime failed while running a graph (e.g. a kernel that exists but refuses
    these dtypes at run time)."""


class SizesKeepChanging(Exception):
    """A size prelude (ortlite.runner.SizeConstants) computed nearly every call anew: from now
    on the runner's calls go to `replacement`, the graph compiled without one."""

    def __init__(self, replacement):
        super().__init__("sizes keep changing")
        self.replacement = replacement


ARG_KINDS = {"tensor": K_TENSOR, "int": K_INT, "float": K_FLOAT, "bool": K_BOOL, "unused": K_UNUSED, "frozen": K_FROZEN}
OUTPUT_SOURCES = {"ort": S_ORT, "input": S_INPUT, "const": S_CONST, "sym": S_SYM}


include "hotpath/ort_api.pxi"
include "hotpath/tensor_access.pxi"
include "hotpath/arguments.pxi"
include "hotpath/runner.pxi"
