# cython: language_level=3, boundscheck=False, wraparound=False
"""The per-call hot path: check arguments against the session's input schema, wrap them
by data pointer, allocate outputs, run, and hand results back.

Everything that can be is computed once, when the Runner is built (ortlite/runner.py).
Sessions made through ONNX Runtime's C API (CSession, the default on CPU) run with Run() on
OrtValues over torch's memory; others (CUDA, a user's SessionOptions, or no C library) run
through the pybind module's IOBinding. Either way a call takes a _Binding from a small pool
(one per concurrent caller) holding what it last bound, so only what changed is rewrapped.
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


# ---- ONNX Runtime's C API (see _ort.pxd) ----

cdef void** _api = NULL  # the OrtApi table, NULL when the library could not be loaded
cdef OrtEnv* _env = NULL
cdef OrtMemoryInfo* _cpu_info = NULL
cdef RunFn _run = NULL
cdef CreateTensorWithDataFn _create_tensor = NULL
cdef ReleaseFn _release_value = NULL
cdef ReleaseFn _release_status = NULL

C_API_PROBLEM = None  # why the C API is not used (None: it is)
C_API_LIBRARY = None  # the library loaded


class OrtError(RuntimeError):
    """An error status from ONNX Runtime's C API; the message is ONNX Runtime's."""


cdef int _check(OrtStatus* status) except -1:
    """Raises OrtError for an error status (and releases it)."""
    if status == NULL:
        return 0
    code = (<GetErrorCodeFn>_api[SLOT_GetErrorCode])(status)
    message = (<GetErrorMessageFn>_api[SLOT_GetErrorMessage])(status).decode("utf-8", "replace")
    _release_status(status)
    raise OrtError(f"[ONNXRuntimeError] : {code} : {message}")


def _library_path():
    import onnxruntime
    from onnxruntime.capi import onnxruntime_pybind11_state

    return os.path.join(os.path.dirname(onnxruntime_pybind11_state.__file__), f"libonnxruntime.so.{onnxruntime.__version__}")


cdef void** _open(path, list problem):
    """dlopen ONNX Runtime's shared library at path: its OrtApi table, or NULL with the reason
    appended to problem. (The wheel's library has no unversioned name; it is a second runtime
    beside the pybind module's own, and sessions made through one run only through it.)"""
    cdef void* handle
    cdef OrtGetApiBaseFn get_base
    cdef const OrtApiBase* base
    cdef void** api
    handle = dlopen(os.fsencode(path), RTLD_NOW | RTLD_LOCAL)
    if handle == NULL:
        problem.append(f"cannot load {path}: {(<bytes>dlerror()).decode('utf-8', 'replace')}")
        return NULL
    get_base = <OrtGetApiBaseFn>dlsym(handle, b"OrtGetApiBase")
    if get_base == NULL:
        problem.append(f"{path} has no OrtGetApiBase")
        return NULL
    base = get_base()
    api = <void**>base.GetApi(ORT_API_VERSION_USED)
    if api == NULL:
        problem.append(f"{path} (ONNX Runtime {(<bytes>base.GetVersionString()).decode()}) does not support C API version {ORT_API_VERSION_USED}")
    return api


def check_library(path):
    """Why ONNX Runtime's C API could not be used from the library at path (None: it could)."""
    problem = []
    _open(path, problem)
    return problem[0] if problem else None


def load_library(path):
    """Take the C API from the library at path for this process: None, or why not."""
    global _api, _env, _cpu_info, _run, _create_tensor, _release_value, _release_status, C_API_LIBRARY
    if _api != NULL:
        return None
    problem = []
    cdef void** api = _open(path, problem)
    if api == NULL:
        return problem[0]
    _api = api
    _release_status = <ReleaseFn>api[SLOT_ReleaseStatus]
    _release_value = <ReleaseFn>api[SLOT_ReleaseValue]
    _run = <RunFn>api[SLOT_Run]
    _create_tensor = <CreateTensorWithDataFn>api[SLOT_CreateTensorWithDataAsOrtValue]
    try:
        _check((<CreateEnvFn>api[SLOT_CreateEnv])(2, b"ortlite", &_env))  # warnings, as the pybind module's
        _check((<CreateCpuMemoryInfoFn>api[SLOT_CreateCpuMemoryInfo])(OrtArenaAllocator, OrtMemTypeDefault, &_cpu_info))
    except OrtError as e:
        _api = NULL
        return f"{path}: {e}"
    C_API_LIBRARY = path
    return None


def _load_at_import():
    try:
        return load_library(_library_path())
    except Exception as e:  # an unusual wheel: no such file, no version
        return f"cannot find ONNX Runtime's library: {e}"


C_API_PROBLEM = _load_at_import()


cdef class CRunOptions:
    cdef OrtRunOptions* ptr

    def __cinit__(self, int log_severity_level=ORT_LOGGING_LEVEL_FATAL, dict config=None):
        _check((<CreateRunOptionsFn>_api[SLOT_CreateRunOptions])(&self.ptr))
        _check((<RunOptionsIntFn>_api[SLOT_RunOptionsSetRunLogSeverityLevel])(self.ptr, log_severity_level))
        for key, value in (config or {}).items():
            _check((<AddConfigEntryFn>_api[SLOT_AddRunConfigEntry])(self.ptr, key.encode(), value.encode()))

    def __dealloc__(self):
        if self.ptr != NULL:
            (<ReleaseFn>_api[SLOT_ReleaseRunOptions])(self.ptr)


cdef class CSession:
    """An OrtSession made through the C API (CPU execution provider)."""
    cdef OrtSession* ptr
    cdef readonly list providers

    def __dealloc__(self):
        if self.ptr != NULL:
            (<ReleaseFn>_api[SLOT_ReleaseSession])(self.ptr)

    def get_providers(self):
        return list(self.providers)


cdef class CFloor:
    """bench/overhead.py's C-API floor: Run on OrtValues made once over these tensors."""
    cdef CSession sess
    cdef CRunOptions run_options
    cdef list keep
    cdef Py_ssize_t n_in, n_out
    cdef const char** names
    cdef OrtValue** values

    def __init__(self, CSession sess, dict inputs, dict outputs, dict elem_types):
        cdef Py_ssize_t k
        self.sess, self.run_options = sess, CRunOptions()
        items = list(inputs.items()) + list(outputs.items())
        self.keep = [(name.encode(), t) for name, t in items]
        self.n_in, self.n_out = len(inputs), len(outputs)
        self.names = <const char**>calloc(len(items) + 1, sizeof(char*))
        self.values = <OrtValue**>calloc(len(items) + 1, sizeof(OrtValue*))
        for k, (name, t) in enumerate(self.keep):
            self.names[k] = <const char*>name
            self.values[k] = _wrap(_cpu_info, t.data_ptr(), t.shape, elem_types[t.dtype], t.element_size())

    def __dealloc__(self):
        cdef Py_ssize_t k
        if self.values != NULL:
            for k in range(self.n_in + self.n_out):
                _release(self.values[k])
        free(self.values)
        free(self.names)

    def __call__(self):
        cdef OrtStatus* status
        with nogil:
            status = _run(self.sess.ptr, self.run_options.ptr, self.names, <const OrtValue* const*>self.values, self.n_in,
                          self.names + self.n_in, self.n_out, self.values + self.n_in)
        _check(status)


cdef Py_ssize_t _live_values = 0  # OrtValues ortlite owns now (tests check it stays flat)


def live_values():
    return _live_values


cdef inline void _release(OrtValue* value) noexcept:
    global _live_values
    if value != NULL:
        _live_values -= 1
        _release_value(value)


cdef OrtValue* _wrap(OrtMemoryInfo* info, uintptr_t ptr, shape, int elem_type, Py_ssize_t itemsize) except? NULL:
    """An OrtValue over memory at ptr (not owned) of this shape and element type."""
    cdef int64_t dims[64]
    cdef Py_ssize_t rank = len(shape), k
    cdef size_t nbytes = itemsize
    cdef OrtValue* value = NULL
    if rank > 64:
        raise ValueError(f"ortlite: tensors of rank {rank} are not supported (at most 64)")
    for k in range(rank):
        dims[k] = shape[k]
        nbytes *= <size_t>dims[k]
    _check(_create_tensor(info, <void*>ptr, nbytes, dims, rank, elem_type, &value))
    global _live_values
    _live_values += 1
    return value


def create_c_session(bytes model, int intra_op_threads, int inter_op_threads, int optimization_level,
                     dict config=None, list weight_names=None, list weights=None):
    """A CPU session through the C API. weights: (tensor, elem_type) per name in weight_names,
    contiguous CPU tensors given to ORT as external initializers (ORT copies them)."""
    if _api == NULL:
        raise RuntimeError(f"ortlite: ONNX Runtime's C API is not available: {C_API_PROBLEM}")
    cdef OrtSessionOptions* so = NULL
    cdef CSession sess = CSession.__new__(CSession)
    cdef const char** names = NULL
    cdef OrtValue** values = NULL
    cdef Py_ssize_t n = len(weight_names) if weight_names else 0, k
    cdef const char* data = model
    encoded = [name.encode() for name in weight_names or ()]
    try:
        _check((<CreateSessionOptionsFn>_api[SLOT_CreateSessionOptions])(&so))
        _check((<SessionOptionsIntFn>_api[SLOT_SetIntraOpNumThreads])(so, intra_op_threads))
        _check((<SessionOptionsIntFn>_api[SLOT_SetInterOpNumThreads])(so, inter_op_threads))
        _check((<SessionOptionsIntFn>_api[SLOT_SetSessionGraphOptimizationLevel])(so, optimization_level))
        _check((<SessionOptionsIntFn>_api[SLOT_SetSessionLogSeverityLevel])(so, ORT_LOGGING_LEVEL_FATAL))
        for key, value in (config or {}).items():
            _check((<AddConfigEntryFn>_api[SLOT_AddSessionConfigEntry])(so, key.encode(), value.encode()))
        if n:
            names = <const char**>calloc(n, sizeof(char*))
            values = <OrtValue**>calloc(n, sizeof(OrtValue*))
            if names == NULL or values == NULL:
                raise MemoryError()
            for k in range(n):
                t, elem_type = weights[k]
                names[k] = encoded[k]
                values[k] = _wrap(_cpu_info, t.data_ptr(), t.shape, elem_type, t.element_size())
            _check((<AddExternalInitializersFn>_api[SLOT_AddExternalInitializers])(so, names, <const OrtValue* const*>values, n))
        _check((<CreateSessionFromArrayFn>_api[SLOT_CreateSessionFromArray])(_env, data, len(model), so, &sess.ptr))
    finally:
        for k in range(n if values != NULL else 0):
            _release(values[k])
        free(names)
        free(values)
        if so != NULL:
            (<ReleaseFn>_api[SLOT_ReleaseSessionOptions])(so)
    sess.providers = ["CPUExecutionProvider"]
    return sess


cdef object _tensor_of(OrtValue* value, object template, int expected_type):
    """A new torch tensor (like template: dtype, CPU) with a copy of value's contents."""
    cdef OrtTensorTypeAndShapeInfo* info = NULL
    cdef size_t rank, k
    cdef int64_t dims[64]
    cdef void* data
    cdef int elem_type
    _check((<GetTensorTypeAndShapeFn>_api[SLOT_GetTensorTypeAndShape])(value, &info))
    try:
        _check((<GetTensorElementTypeFn>_api[SLOT_GetTensorElementType])(info, &elem_type))
        if elem_type != expected_type:
            raise RuntimeError(f"ortlite: ONNX Runtime returned an output of ONNX element type {elem_type}, expected {expected_type}")
        _check((<GetDimensionsCountFn>_api[SLOT_GetDimensionsCount])(info, &rank))
        if rank > 64:
            raise ValueError(f"ortlite: ONNX Runtime returned a tensor of rank {rank} (at most 64 supported)")
        _check((<GetDimensionsFn>_api[SLOT_GetDimensions])(info, dims, rank))
    finally:
        (<ReleaseFn>_api[SLOT_ReleaseTensorTypeAndShapeInfo])(info)
    out = template.new_empty([dims[k] for k in range(rank)])
    _check((<GetTensorMutableDataFn>_api[SLOT_GetTensorMutableData])(value, &data))
    if out.nbytes:
        memcpy(<void*><uintptr_t>out.data_ptr(), data, out.nbytes)
    return out


cdef class _Binding:
    """What one caller at a time binds: a pybind IOBinding (iob), or for a CSession the
    OrtValues of inputs and outputs (in_values, out_values; NULL where none); what was last
    bound, and buffers for scalar arguments."""
    cdef object sess             # the session it belongs to, and the pool it goes back to
    cdef list pool
    cdef object iob
    cdef OrtValue** in_values    # per argument
    cdef OrtValue** out_values   # per ONNX output
    cdef int64_t* scalars        # per argument: the memory of a Python number's 0-d value
    cdef Py_ssize_t n_in, n_out
    cdef uintptr_t* bound_ptrs   # per argument: the data pointer bound (0: none yet)
    cdef list bound_shapes
    cdef list scalar_buffers     # 0-d tensors, bound once, written in place per call
    cdef list scalar_ptrs
    cdef list outputs            # the output tensors bound last (kept only when recycling)
    cdef uintptr_t* bound_out_ptrs  # per ONNX output: the data pointer bound (recycling)
    cdef int64_t bound_key       # the pattern key's first dim bound (-1: none yet)
    cdef object bound_constants  # the size constants' tuple bound last (ortlite.runner.SizeConstants)

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.in_values != NULL:
            for i in range(self.n_in):
                _release(self.in_values[i])
        if self.out_values != NULL:
            for i in range(self.n_out):
                _release(self.out_values[i])
        free(self.in_values)
        free(self.out_values)
        free(self.scalars)
        free(self.bound_ptrs)
        free(self.bound_out_ptrs)

    cdef int set_input(self, Py_ssize_t i, uintptr_t ptr, shape, int elem_type, Py_ssize_t itemsize) except -1:
        cdef OrtValue* value = _wrap(_cpu_info, ptr, shape, elem_type, itemsize)
        _release(self.in_values[i])
        self.in_values[i] = value
        return 0

    cdef int set_output(self, Py_ssize_t i, uintptr_t ptr, shape, int elem_type, Py_ssize_t itemsize) except -1:
        """ptr 0: ORT allocates this output."""
        cdef OrtValue* value = _wrap(_cpu_info, ptr, shape, elem_type, itemsize) if ptr else NULL
        _release(self.out_values[i])
        self.out_values[i] = value
        return 0


cdef object _storage_use_count = torch._C._storage_Use_Count


cdef extern from "Python.h":
    ctypedef struct _TypeWithWeaklist "PyTypeObject":
        Py_ssize_t tp_weaklistoffset


# The frozen-weight check reads a tensor's version counter and data pointer through the C
# functions behind TensorBase._version and TensorBase.data_ptr, found once here: the same
# code Python calls, without the attribute lookup through nn.Parameter's class chain.
cdef extern from "Python.h":
    ctypedef object (*getter)(object, void*)
    ctypedef struct PyGetSetDef:
        getter get
        void* closure
    ctypedef struct PyGetSetDescrObject:
        PyGetSetDef* d_getset
    ctypedef object (*PyCFunction)(object, PyObject*)
    ctypedef struct PyMethodDef:
        PyCFunction ml_meth
        int ml_flags
    ctypedef struct PyMethodDescrObject:
        PyMethodDef* d_method
    PyObject* PyWeakref_GetObject(object ref) except NULL
    object PyObject_GenericGetDict(object o, void* context)
    int METH_NOARGS


cdef object _version_descr = torch._C.TensorBase.__dict__["_version"]
cdef object _data_ptr_descr = torch._C.TensorBase.__dict__["data_ptr"]
cdef bint _direct = (  # else (a torch that defines them otherwise): plain attribute access
    type(_version_descr) is types.GetSetDescriptorType
    and type(_data_ptr_descr) is types.MethodDescriptorType
    and (<PyMethodDescrObject*>_data_ptr_descr).d_method.ml_flags == METH_NOARGS
)
cdef PyGetSetDef* _version_def = (<PyGetSetDescrObject*>_version_descr).d_getset if _direct else NULL
cdef PyCFunction _data_ptr_fn = (<PyMethodDescrObject*>_data_ptr_descr).d_method.ml_meth if _direct else NULL


cdef inline object _version_of(object t):
    return _version_def.get(t, _version_def.closure) if _direct else t._version


cdef inline object _data_ptr_of(object t):
    return _data_ptr_fn(t, NULL) if _direct else t.data_ptr()


cdef inline bint _has_weakrefs(object o):
    cdef Py_ssize_t offset = (<_TypeWithWeaklist*>(<PyObject*>o).ob_type).tp_weaklistoffset
    if offset <= 0:
        return False
    return (<PyObject**>((<char*><PyObject*>o) + offset))[0] != NULL


cdef PyGetSetDef* _requires_grad_def = NULL
_requires_grad_descr = torch._C.TensorBase.__dict__.get("requires_grad")
if _direct and type(_requires_grad_descr) is types.GetSetDescriptorType:
    _requires_grad_def = (<PyGetSetDescrObject*>_requires_grad_descr).d_getset


# Reference counts read straight from torch's C++ objects, for the recycling check below: the
# TensorImpl a tensor object wraps (THPVariable.cdata), its StorageImpl (TensorImpl.storage_),
# and the combined count of each (c10::intrusive_ptr_target's word after the vtable pointer:
# the use count in its low 32 bits, and its top bit set once a Python object wraps the target;
# a Python storage object, once made, stays as long as the tensor: someone may hold it). The
# offsets are found and checked at import against torch's own accessors (t._cdata,
# untyped_storage()._cdata, _use_count, _storage_Use_Count); where anything disagrees
# (another torch), _raw_counts stays False and the check calls those accessors instead.
cdef Py_ssize_t _IMPL_OFFSET = -1     # of the TensorImpl* in a tensor object
cdef Py_ssize_t _STORAGE_OFFSET = -1  # of the StorageImpl* in a TensorImpl
cdef bint _raw_counts = False
cdef Py_ssize_t _DATA_OFFSET = -1            # of the data pointer in a StorageImpl (its DataPtr)
cdef Py_ssize_t _STORAGE_OFFSET_OFFSET = -1  # of storage_offset_ (elements) in a TensorImpl
cdef bint _raw_data = False
cdef uint64_t _HAS_PYOBJECT = (<uint64_t>1) << 63
cdef uint64_t _USES = 0xFFFFFFFF  # (typed: a literal this large would be a Python int)


cdef inline void* _impl_of(object t) noexcept:
    return (<void**>((<char*><PyObject*>t) + _IMPL_OFFSET))[0]


cdef inline uint64_t _counts_at(void* target) noexcept:
    return (<uint64_t*>((<char*>target) + sizeof(void*)))[0]


cdef inline void* _storage_impl_of(void* impl) noexcept:
    return (<void**>((<char*>impl) + _STORAGE_OFFSET))[0]


cdef inline bint _sole_user(void* target) noexcept:
    """One use of target and no Python object wrapping it (a storage's)."""
    return (_counts_at(target) & (_HAS_PYOBJECT | _USES)) == 1


cdef Py_ssize_t _find_word(void* base, uintptr_t value, Py_ssize_t start, Py_ssize_t limit):
    cdef Py_ssize_t off
    for off in range(start, limit, sizeof(void*)):
        if (<uintptr_t*>((<char*>base) + off))[0] == value:
            return off
    return -1


cdef inline uintptr_t _raw_data_ptr(object t, Py_ssize_t itemsize) noexcept:
    """t.data_ptr() of a dense tensor with elements, read from its TensorImpl and StorageImpl."""
    cdef void* impl = _impl_of(t)
    return ((<uintptr_t*>((<char*>_storage_impl_of(impl)) + _DATA_OFFSET))[0]
            + <uintptr_t>((<int64_t*>((<char*>impl) + _STORAGE_OFFSET_OFFSET))[0] * itemsize))


cdef set _offsets_of(void* base, uintptr_t value, Py_ssize_t limit):
    cdef Py_ssize_t off
    return {off for off in range(0, limit, sizeof(void*)) if (<uintptr_t*>((<char*>base) + off))[0] == value}


def _find_data_layout():
    """Find and check the offsets _raw_data_ptr reads: True, or what failed."""
    global _DATA_OFFSET, _STORAGE_OFFSET_OFFSET
    import numpy
    base = torch.arange(200, dtype=torch.float64)
    samples = [base[7:], base[13:50], torch.from_numpy(numpy.arange(9, dtype=numpy.int32))[5:], torch.ones(3, 4, dtype=torch.int64)[1:],
               torch.empty(64, dtype=torch.uint8)[33:], torch.zeros(5, dtype=torch.bool)[2:], torch.randn(4, 4).t()[1:]]
    data, offsets = None, None
    for t in samples:
        storage = t.untyped_storage()
        found = _offsets_of(<void*><uintptr_t>storage._cdata, storage.data_ptr(), 128)
        data = found if data is None else data & found
        found = _offsets_of(_impl_of(t), t.storage_offset(), 512)
        offsets = found if offsets is None else offsets & found
    if len(data) != 1 or len(offsets) != 1:
        return "storage data pointer or offset layout"
    _DATA_OFFSET, _STORAGE_OFFSET_OFFSET = data.pop(), offsets.pop()
    for t in samples + _fresh_tensors():
        if t.numel() and _raw_data_ptr(t, t.element_size()) != t.data_ptr():
            return "data pointer"
    return True


def _fresh_tensors():
    return [torch.empty(3), torch.zeros(2, 5, dtype=torch.int64), torch.empty(0), torch.nn.Parameter(torch.ones(4)).detach(), torch.ones(6) + 1]


def _find_raw_layout():
    """Find and check the offsets _unobservable reads (see above): True, or what failed."""
    global _IMPL_OFFSET, _STORAGE_OFFSET
    from torch.utils.dlpack import to_dlpack
    found = _fresh_tensors()
    offsets = {_find_word(<void*><PyObject*>t, <uintptr_t>t._cdata, sizeof(PyObject), 64) for t in found}
    if len(offsets) != 1 or -1 in offsets:
        return "tensor object layout"
    _IMPL_OFFSET = offsets.pop()
    offsets = {_find_word(_impl_of(t), <uintptr_t>t.untyped_storage()._cdata, sizeof(void*), 512) for t in found}
    if len(offsets) != 1 or -1 in offsets:
        return "TensorImpl layout"
    _STORAGE_OFFSET = offsets.pop()
    for t in _fresh_tensors():  # none has had a Python storage object
        impl = _impl_of(t)
        if <uintptr_t>impl != <uintptr_t>t._cdata or (_counts_at(impl) & _USES) != t._use_count() or t._use_count() != 1:
            return "tensor use count"
        held = to_dlpack(t)  # a C++ reference to the TensorImpl
        if (_counts_at(impl) & _USES) != 2 or t._use_count() != 2:
            return "tensor use count with a C++ reference"
        del held
        storage = _storage_impl_of(impl)
        if not _sole_user(storage) or _storage_use_count(<uintptr_t>storage) != 1:
            return "storage use count"
        view = t.view(t.shape)  # another TensorImpl on the same storage
        if _sole_user(storage) or (_counts_at(storage) & _USES) != 2 or _storage_use_count(<uintptr_t>storage) != 2:
            return "storage use count with a view"
        del view
        if not _sole_user(storage):
            return "storage use count after a view"
        python_storage = t.untyped_storage()
        if python_storage._cdata != <uintptr_t>storage or _sole_user(storage):
            return "storage with a Python object"
    return True


def _verdict(find):
    """find()'s verdict on a layout: True, or why not (what it found wrong, or what it raised)."""
    try:
        return find()
    except Exception as e:
        return repr(e)


RAW_LAYOUT = _verdict(_find_raw_layout)  # True, or why the recycling check calls torch's accessors
_raw_counts = RAW_LAYOUT is True
# True, or why data pointers are read through torch's accessor (None: counts not found)
RAW_DATA_LAYOUT = _verdict(_find_data_layout) if _raw_counts else None
_raw_data = RAW_DATA_LAYOUT is True


# TensorImpl.autograd_meta_ follows its storage_: null means the tensor cannot require grad,
# which spares the recycling check torch's requires_grad getter (its __torch_function__ checks).
cdef Py_ssize_t _AUTOGRAD_META_OFFSET = -1
cdef bint _raw_autograd = False


cdef inline void* _autograd_meta_of(void* impl) noexcept:
    return (<void**>((<char*>impl) + _AUTOGRAD_META_OFFSET))[0]


def _find_autograd_layout():
    """Check where _unobservable reads autograd_meta_: True, or what failed."""
    global _AUTOGRAD_META_OFFSET
    _AUTOGRAD_META_OFFSET = _STORAGE_OFFSET + sizeof(void*)
    for t in _fresh_tensors():
        if _autograd_meta_of(_impl_of(t)) != NULL:
            return "autograd metadata of a tensor that never required grad"
        t.requires_grad_(t.is_floating_point())
        if t.is_floating_point() and _autograd_meta_of(_impl_of(t)) == NULL:
            return "autograd metadata of a tensor that requires grad"
    return True


AUTOGRAD_LAYOUT = _verdict(_find_autograd_layout) if _raw_counts else None
_raw_autograd = AUTOGRAD_LAYOUT is True


# The frozen-weight check's reads (Runner._weights_changed), straight from the TensorImpl
# where its layout checks out: the version counter (version_counter_, an intrusive_ptr to a
# VersionCounter whose uint32 version_ follows intrusive_ptr_target's vtable pointer and
# counts; null for an inference tensor, which has none) and the data pointer of its storage.
# torch's own getters cost ~150 ns a weight (a Python int each, __torch_function__ checks on
# a Parameter); these a few ns.
cdef Py_ssize_t _VERSION_COUNTER_OFFSET = -1
DEF VERSION_IN_COUNTER = 16
cdef bint _raw_versions = False


cdef inline int64_t _raw_version(void* impl) noexcept:
    """The tensor's version counter, -1 when it has none (an inference tensor)."""
    cdef char* counter = (<char**>((<char*>impl) + _VERSION_COUNTER_OFFSET))[0]
    return -1 if counter == NULL else (<uint32_t*>(counter + VERSION_IN_COUNTER))[0]


cdef inline uintptr_t _frozen_ptr(object t, Py_ssize_t itemsize) noexcept:
    """Where a frozen tensor's data is, as _weights_changed compares it: _raw_data_ptr, also for
    an empty tensor (whose data_ptr() is 0; this is only compared with itself); 0 without a
    storage."""
    if _storage_impl_of(_impl_of(t)) == NULL:
        return 0
    return _raw_data_ptr(t, itemsize)


def _find_version_layout():
    """Check where _raw_version reads: True, or what failed."""
    global _VERSION_COUNTER_OFFSET
    _VERSION_COUNTER_OFFSET = _STORAGE_OFFSET + 3 * sizeof(void*)  # after autograd_meta_, extra_meta_
    tensors = _fresh_tensors() + [torch.nn.Parameter(torch.ones(3)), torch.zeros(4, dtype=torch.bool)]
    for t in tensors:
        for step in range(3):
            if _raw_version(_impl_of(t)) != t._version:
                return "version counter"
            with torch.no_grad():
                t.zero_()
        view = t.detach()[:1] if t.dim() else t.detach()
        if _raw_version(_impl_of(view)) != t._version:
            return "version counter of a view"
    with torch.inference_mode():
        if _raw_version(_impl_of(torch.ones(2))) != -1:
            return "inference tensor"
    return True


VERSION_LAYOUT = _verdict(_find_version_layout) if _raw_data else None
_raw_versions = VERSION_LAYOUT is True


# The tensor check of the guarded path, read from the TensorImpl where its layout checks out:
# exact Python type, dispatch key set (TensorImpl.key_set_), dtype (data_type_, a 16-bit
# TypeMeta), sizes and strides (sizes_and_strides_: a count, then up to 5 sizes and 5 strides
# inline). For CPU tensors of static shape (the C-API path); else TensorGuards.
DEF MAX_RAW_DIMS = 5
# ONNX Runtime keeps every memory plan it makes, and each holds memory about the size of
# the run's intermediates: a session fed ever new sizes grows without bound (16k batch
# sizes of an 8-layer MLP: 17 GB). A runner gives this many sets of sizes a plan of their
# own; all later ones share one more (ORT then allocates what does not fit it one by one).
DEF MAX_PATTERN_KEYS = 4
DEF SHARED_PATTERN_KEY = 0x2545F4914F6CDD1D
cdef Py_ssize_t _KEYS_OFFSET = -1
cdef Py_ssize_t _DTYPE_OFFSET = -1
cdef Py_ssize_t _DIMS_OFFSET = -1
cdef bint _raw_guard = False

ctypedef struct RawCheck:
    Py_ssize_t arg
    void* pytype
    uint64_t keys
    uint16_t dtype
    Py_ssize_t ndim
    int64_t sizes[MAX_RAW_DIMS]
    int64_t strides[MAX_RAW_DIMS]


cdef inline bint _raw_matches(object a, RawCheck* c) noexcept:
    cdef char* impl
    cdef int64_t* dims
    cdef Py_ssize_t d
    if <void*>(<PyObject*>a).ob_type != c.pytype:
        return False
    impl = <char*>_impl_of(a)
    if (<uint64_t*>(impl + _KEYS_OFFSET))[0] != c.keys or (<uint16_t*>(impl + _DTYPE_OFFSET))[0] != c.dtype:
        return False
    dims = <int64_t*>(impl + _DIMS_OFFSET)
    if dims[0] != c.ndim:
        return False
    for d in range(c.ndim):
        if dims[1 + d] != c.sizes[d] or dims[1 + MAX_RAW_DIMS + d] != c.strides[d]:
            return False
    return True


cdef int _raw_check_of(RawCheck* c, object t, Py_ssize_t arg) except -1:
    """Fill c from tensor t (which has passed validation)."""
    cdef Py_ssize_t d
    c.arg = arg
    c.pytype = <void*>(<PyObject*>t).ob_type
    c.keys = torch._C._dispatch_keys(t).raw_repr()
    c.dtype = (<uint16_t*>((<char*>_impl_of(t)) + _DTYPE_OFFSET))[0]
    c.ndim = t.dim()
    for d in range(c.ndim):
        c.sizes[d] = t.shape[d]
        c.strides[d] = t.stride(d)
    return 0


cdef bint _dims_at(object t, Py_ssize_t off):
    cdef int64_t* dims = <int64_t*>((<char*>_impl_of(t)) + off)
    cdef Py_ssize_t d
    for d in range(t.dim()):
        if dims[1 + d] != t.shape[d] or dims[1 + MAX_RAW_DIMS + d] != t.stride(d):
            return False
    return True


def _find_guard_layout():
    """Find the offsets _raw_matches reads and check it against TensorGuards: True, or what failed."""
    global _KEYS_OFFSET, _DTYPE_OFFSET, _DIMS_OFFSET
    cdef Py_ssize_t off
    cdef RawCheck check
    from torch._C._dynamo.guards import TensorGuards
    dtypes = [torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool, torch.float16, torch.complex64]
    shapes = [(3,), (2, 5), (4, 1, 6), (7, 11, 13), (2, 3, 1, 4, 5)]
    samples = [torch.zeros(shape, dtype=dtype) for dtype in dtypes for shape in shapes]
    keys, dims = None, None
    for t in samples:
        found = _offsets_of(_impl_of(t), torch._C._dispatch_keys(t).raw_repr(), 512)
        keys = found if keys is None else keys & found
        found = {o for o in _offsets_of(_impl_of(t), t.dim(), 512) if _dims_at(t, o)}
        dims = found if dims is None else dims & found
    if len(keys) != 1 or len(dims) != 1:
        return "key set or sizes layout"
    _KEYS_OFFSET, _DIMS_OFFSET = keys.pop(), dims.pop()
    dtype_offsets = []
    for off in range(0, 512, 2):
        seen = {}
        for t in samples:
            value = (<uint16_t*>((<char*>_impl_of(t)) + off))[0]
            if seen.setdefault(t.dtype, value) != value:
                break
        else:
            if len(set(seen.values())) == len(dtypes):
                dtype_offsets.append(off)
    if len(dtype_offsets) != 1:
        return "dtype layout"
    _DTYPE_OFFSET = dtype_offsets[0]
    # the same verdicts as TensorGuards (requires_grad aside: the runner does not need it)
    for dtype in (torch.float32, torch.int64):
        for shape in ((8, 8), (1, 64), (3, 4, 5)):
            t = torch.randn(shape).to(dtype)
            guard = TensorGuards(t, dynamic_dims_sizes=[list(shape)], dynamic_dims_strides=[list(t.stride())])
            _raw_check_of(&check, t, 0)
            base = torch.zeros(200, dtype=dtype)
            others = [torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.int32),
                      torch.zeros(tuple(reversed(shape)), dtype=dtype).permute(*reversed(range(len(shape)))),
                      torch.zeros(shape[:len(shape) - 1] + (shape[len(shape) - 1] + 1,), dtype=dtype),
                      torch.zeros((2,) + shape, dtype=dtype)[1], base[3:3 + t.numel()].view(shape), torch.zeros(shape, dtype=dtype).unsqueeze(0),
                      torch.nn.Parameter(torch.zeros(shape, dtype=torch.float32)).detach().to(dtype), torch.zeros(shape, dtype=dtype, device="meta"),
                      torch.zeros(shape, dtype=torch.complex64).conj(), torch.zeros(shape, dtype=dtype).expand(shape)]
            with torch.inference_mode():
                others.append(torch.zeros(shape, dtype=dtype))
            for other in others:
                if _raw_matches(other, &check) != bool(guard.check(other)):
                    return f"verdict differs from TensorGuards on a {other.dtype} {tuple(other.shape)} {other.device} tensor"
    return True


# True, or why the guarded path's check is TensorGuards' (None: data layout not found)
RAW_GUARD_LAYOUT = _verdict(_find_guard_layout) if _raw_data else None
_raw_guard = RAW_GUARD_LAYOUT is True


def raw_counts():
    """Whether the recycling check reads reference counts from torch's objects directly."""
    return _raw_counts


cdef inline bint _unobservable(object t, uintptr_t ptr, Py_ssize_t raw_itemsize):
    """True when nothing but the binding can reach tensor t or its memory: no other Python
    reference, no C++ reference (autograd, views, DLPack), no other user of its storage,
    no weak reference, unchanged memory. Refilling it is then invisible. Its attributes go
    (they would have gone with it): aot_autograd stamps each output with symbolic sizes
    (_dynamo_propagated_dynamic_indices), which otherwise kept every such output from being
    recycled; a dict someone else holds keeps the tensor from being recycled.
    raw_itemsize: t's element size when it has elements and _raw_data holds (its data
    pointer is then read from torch's objects), else 0."""
    cdef void* impl
    if not (
        Py_REFCNT(t) == 2  # the binding's list and this function's argument
        and type(t) is Tensor
        and not _has_weakrefs(t)
    ):
        return False
    if not _raw_counts:
        # Through torch's accessors a storage's count cannot tell a Python storage object
        # someone holds (untyped_storage() makes one that then stays): never recycle.
        return False
    impl = _impl_of(t)
    if (_counts_at(impl) & _USES) != 1 or not _sole_user(_storage_impl_of(impl)):
        return False
    if _raw_autograd and _autograd_meta_of(impl) == NULL:
        pass  # no autograd metadata: it cannot require grad
    elif _requires_grad_def != NULL:
        if _requires_grad_def.get(t, _requires_grad_def.closure):
            return False
    elif t.requires_grad:
        return False
    if raw_itemsize:
        if _raw_data_ptr(t, raw_itemsize) != ptr:
            return False
    elif <uintptr_t>_data_ptr_of(t) != ptr:
        return False
    attributes = PyObject_GenericGetDict(t, NULL)
    if attributes:
        if Py_REFCNT(attributes) != 2:  # the tensor's and this function's
            return False
        (<dict>attributes).clear()
    return True


_strided = torch.strided


cdef inline bint _lazy(a):
    """Whether a's memory is not its values: a negated or conjugated view (the bit says so,
    the memory holds the base's values) or a ZeroTensor (no memory at all)."""
    return a.is_neg() or a.is_conj() or a._is_zerotensor()


cdef bint _overrides_torch_function(a):
    cls = type(a)
    return cls is not Tensor and cls is not _Parameter and getattr(cls.__torch_function__, "__func__", None) is not _tensor_torch_function


_tensor_torch_function = Tensor.__torch_function__.__func__


cdef _materialized(a):
    """A contiguous tensor holding a's values (see _lazy)."""
    if a._is_zerotensor():
        return torch.zeros(a.shape, dtype=a.dtype, device=a.device)
    return a.resolve_conj().resolve_neg().contiguous()


cdef class Runner:
    cdef readonly str name
    cdef object sess
    cdef object run_options
    cdef object binding_factory  # session -> a new pybind SessionIOBinding
    cdef object stream_of       # CUDA graphs: () -> a key of torch's current stream; else None
    cdef object session_for     # stream key -> a session running on that stream
    cdef object stream_key
    cdef dict by_stream         # stream key -> (session, binding pool)
    cdef Py_ssize_t n_args
    cdef list kinds
    cdef int* c_kinds           # kinds, per argument, as a C array
    cdef char* c_static         # in_static, likewise
    cdef Py_ssize_t* c_in_raw   # per argument: its element size where its data pointer can be read
                                # directly (_raw_data; a static tensor with elements), else 0
    cdef Py_ssize_t* c_out_raw  # per ONNX output: likewise
    cdef list in_names
    cdef list in_dtypes
    cdef list in_elem_types
    cdef list in_ort_devices
    cdef list in_device_index   # -1 for CPU, N for cuda:N
    cdef list in_shapes         # expected shape; -1 marks a dynamic dim
    cdef list in_static         # bool: every dim static
    cdef list out_names
    cdef list out_elem_types
    cdef list out_ort_devices
    cdef list out_templates     # tensors whose empty_like is the output buffer
    cdef list out_shapes
    cdef object scratch         # bound in place of zero-element tensors (their data_ptr is 0)
    cdef uintptr_t scratch_ptr
    cdef list plan_source
    cdef list plan_index
    cdef list plan_value
    cdef list plan_scalar
    cdef bint single_output     # the graph returns exactly one ORT output, as a 1-tuple
    cdef bint returns_tuple     # False: return the single result bare (fused FX submodules)
    cdef list pool
    cdef object guard           # checks all tensor arguments at once (torch's TensorGuards)
    cdef object guard_check     # its bound check method
    cdef RawCheck* raw_checks   # the same check read from the TensorImpls (_raw_matches); NULL: none
    cdef Py_ssize_t n_raw_checks
    cdef bint raw_tried         # raw_checks were built, or could not be
    cdef list raw_types         # the Python types raw_checks point to
    cdef object guard_factory   # builds the guard from the first arguments that pass validation
    cdef list tensor_indices    # the guard checks these arguments
    cdef bint all_tensors
    cdef bint recycle_outputs   # refill a binding's previous outputs when nothing can observe them
    cdef object sizes_fn        # symbolic sizes: args -> (output shapes, size outputs); None when static
    cdef Py_ssize_t recycle_max_bytes
    cdef list failure_outputs   # ORT output indices of 0-d bool (CPU) conditions: raise when true
    cdef list failure_messages
    cdef list failure_to_torch  # per condition: fail the run (on_run_failure) rather than raise
    cdef public long runs
    cdef list frozen_indices    # arguments that are initializers of the session; None: none are
    cdef list frozen_refs       # weak references to the tensors the session was built from
    cdef uintptr_t* frozen_ptrs  # their data pointers and version counters then
    cdef int64_t* frozen_versions
    cdef Py_ssize_t* frozen_itemsizes
    cdef list frozen_contents   # bytes of a buffer's contents then (None for a parameter)
    cdef public object on_weights_changed  # args -> None: refreezes (set_frozen) or replaces the runner
    cdef public object on_run_failure  # RunError -> a callable to run this graph from now on (or raise)
    cdef bint takes_boxed  # built for aot_autograd's boxed calls: one list argument, cleared
    cdef public bint plain_tensors  # refuse tensor subclasses with a __torch_function__ of their own (ortlite.compile: no Dynamo to run it)
    cdef object replacement     # once set (ORT failed, weights keep changing, sizes keep changing): calls go to it
    cdef CRunOptions c_run_options  # for CSessions
    cdef Py_ssize_t n_fed           # arguments ORT gets a value for (not unused, not frozen)
    cdef Py_ssize_t* feed_pos       # per argument: its position among those, -1 for none
    cdef const char** c_in_names    # per fed argument
    cdef const char** c_out_names
    cdef list in_itemsizes
    cdef list out_itemsizes
    cdef list c_names               # the bytes c_in_names and c_out_names point into
    cdef object pattern_key         # the name of the memory-pattern key input (ortlite.lower._sizes_vary); None: none
    cdef readonly object size_constants  # args -> tensors, the inputs after the arguments (ortlite.lower.hoist); None: none
    cdef Py_ssize_t n_given         # arguments a call passes (n_args less the size constants)
    cdef object key_device          # its OrtDevice (the pybind binding's)
    cdef uint64_t static_dims_xor   # the XOR of the static fed tensors' dims, ORT's part of the key we know
    cdef Py_ssize_t* varying        # the dynamic tensor and int arguments, which the key hashes
    cdef Py_ssize_t n_varying
    cdef uint64_t pattern_hashes[MAX_PATTERN_KEYS]  # the sets of sizes with a plan of their own
    cdef Py_ssize_t n_pattern_keys
    cdef object __weakref__
    cdef dict __dict__  # holds _boxed_call, so that wrappers made with functools.wraps keep it

    def __init__(self, str name, sess, run_options, binding_factory, inputs, outputs, plan, scratch,
                 guard_factory=None, bint returns_tuple=True, bint boxed=False, bint recycle_outputs=False,
                 sizes_fn=None, Py_ssize_t recycle_max_bytes=0, stream_of=None, session_for=None, failures=(),
                 pattern_key=None, size_constants=None):
        """inputs: (kind, name, dtype, elem_type, ort_device, device_index, shape) per argument.
        outputs: (name, elem_type, ort_device, template, shape) per ONNX output.
        plan: (source, index, value, as_scalar) per graph output.
        scratch: a small tensor on the graph's device, bound for zero-element tensors.
        guard_factory: tensor args -> an object whose check(*tensor_args) is true only for
            tensors that match the schema as these do (None: validate argument by argument).
        recycle_outputs: keep two bindings in turn, each with its last outputs bound; when
            no one can observe those tensors any more (see _unobservable), run into them
            again instead of allocating and binding new ones. For small CPU outputs: with
            symbolic sizes, those of the same shape and at most recycle_max_bytes.
        sizes_fn: for symbolic sizes, args -> (shape of every output, values of integer
            outputs); it also checks that sizes agree and lie in their compiled ranges.
            Outputs whose shape is None are allocated per call with those shapes.
        stream_of, session_for: for graphs on CUDA. ORT fixes a session's compute stream
            when it is made, so each torch stream the graph is called on gets its own
            session (made by session_for on first use); stream_of() names the current one.
        failures: (ORT output index, message, to_torch) per 0-d bool CPU output that, when
            true after a run, makes the call raise RuntimeError(message) (aten's runtime
            errors), or, to_torch, fail the run as ORT failing at the node the message names.
        pattern_key: (name, OrtDevice) of a (N, 0) uint8 CPU input the graph has for ORT's
            memory-pattern cache key: per call, N makes that key a hash of the argument sizes
            (see _bind_pattern_key).
        size_constants: (callable, n): the last n inputs are not passed by the caller but
            computed from the call's arguments by callable(args) -> tuple of n tensors
            (ortlite.runner.SizeConstants: int arguments, shapes and frozen weights determine
            them). An ONNX Runtime failure there is a failed run (on_run_failure).
        on_run_failure (attribute): when ORT fails a run, called with the RunError; what it
            returns takes (*args) and runs the graph from then on, this call included.
            None: the RunError is raised."""
        self.name = name
        self.sess = sess
        self.run_options = run_options
        self.binding_factory = binding_factory
        self.n_args = len(inputs)
        self.n_given = self.n_args
        if size_constants is not None:
            self.size_constants, n_constants = size_constants
            self.n_given -= n_constants
        self.kinds = [i[0] for i in inputs]
        self.in_names = [i[1] for i in inputs]
        self.in_dtypes = [i[2] for i in inputs]
        self.in_elem_types = [i[3] for i in inputs]
        self.in_ort_devices = [i[4] for i in inputs]
        self.in_device_index = [i[5] for i in inputs]
        self.in_shapes = [tuple(i[6]) if i[6] is not None else None for i in inputs]
        self.in_static = [i[6] is not None and -1 not in i[6] for i in inputs]
        self.c_kinds = <int*>calloc(self.n_args + 1, sizeof(int))
        self.c_static = <char*>calloc(self.n_args + 1, sizeof(char))
        self.c_in_raw = <Py_ssize_t*>calloc(self.n_args + 1, sizeof(Py_ssize_t))
        self.c_out_raw = <Py_ssize_t*>calloc(len(outputs) + 1, sizeof(Py_ssize_t))
        if self.c_kinds == NULL or self.c_static == NULL or self.c_in_raw == NULL or self.c_out_raw == NULL:
            raise MemoryError()
        for k in range(self.n_args):
            self.c_kinds[k] = self.kinds[k]
            self.c_static[k] = self.in_static[k]
            if _raw_data and self.kinds[k] == K_TENSOR and self.in_static[k] and math.prod(self.in_shapes[k]) > 0:
                self.c_in_raw[k] = self.in_dtypes[k].itemsize
        self.out_names = [o[0] for o in outputs]
        self.out_elem_types = [o[1] for o in outputs]
        self.out_ort_devices = [o[2] for o in outputs]
        self.out_templates = [o[3] for o in outputs]
        self.out_shapes = [tuple(o[4]) if o[4] is not None else None for o in outputs]
        for k in range(len(outputs)):
            if _raw_data and self.out_shapes[k] is not None and math.prod(self.out_shapes[k]) > 0:
                self.c_out_raw[k] = self.out_templates[k].element_size()
        self.plan_source = [p[0] for p in plan]
        self.plan_index = [p[1] for p in plan]
        self.plan_value = [p[2] for p in plan]
        self.plan_scalar = [p[3] for p in plan]
        self.single_output = len(plan) == 1 and plan[0][0] == S_ORT and not plan[0][3]
        self.returns_tuple = returns_tuple
        self.takes_boxed = boxed
        if boxed:  # aot_autograd's convention: one list argument, cleared by the callee
            self._boxed_call = True
        self.pool = []
        self.stream_of = stream_of
        self.session_for = session_for
        self.stream_key = stream_of() if stream_of is not None else None
        self.by_stream = {}
        self.runs = 0
        self.scratch = scratch
        self.scratch_ptr = scratch.data_ptr()
        self.guard = None
        self.recycle_outputs = recycle_outputs
        self.sizes_fn = sizes_fn
        self.recycle_max_bytes = recycle_max_bytes
        self.guard_factory = guard_factory
        self.tensor_indices = [i for i in range(self.n_given) if self.kinds[i] == K_TENSOR]
        self.all_tensors = len(self.tensor_indices) == self.n_given
        self.failure_outputs = [f[0] for f in failures]
        self.failure_messages = [f[1] for f in failures]
        self.failure_to_torch = [f[2] for f in failures]
        self._key_inputs(pattern_key)
        self._c_names(inputs, outputs)
        if recycle_outputs:  # two bindings used in turn: the caller usually still holds the last result
            self.pool.extend([self._new_binding(), self._new_binding()])

    cdef _key_inputs(self, pattern_key):
        cdef Py_ssize_t i, k = 0
        if pattern_key is None:
            return
        self.pattern_key, self.key_device = pattern_key
        self.varying = <Py_ssize_t*>calloc(self.n_args + 1, sizeof(Py_ssize_t))
        if self.varying == NULL:
            raise MemoryError()
        for i in range(self.n_args):
            if self.kinds[i] == K_INT or (self.kinds[i] == K_TENSOR and not self.in_static[i]):
                self.varying[k] = i
                k += 1
            elif self.kinds[i] == K_TENSOR:
                for d in self.in_shapes[i]:
                    self.static_dims_xor ^= <uint64_t>d
        self.n_varying = k

    cdef int _bind_pattern_key(self, _Binding b) except -1:
        """ONNX Runtime keys its cache of memory plans by the XOR of all fed dims (see
        ortlite.lower._sizes_vary). Binds the key input with the first dim that turns that
        XOR into a hash of the dynamic sizes and int arguments bound now, for the first
        MAX_PATTERN_KEYS sets of them; later sets all get SHARED_PATTERN_KEY."""
        cdef uint64_t xor = self.static_dims_xor, h = 14695981039346656037ULL  # FNV-1a
        cdef int64_t n
        cdef Py_ssize_t k, i
        for k in range(self.n_varying):
            i = self.varying[k]
            if self.c_kinds[i] == K_INT:
                h = (h ^ <uint64_t>(<int64_t*>(<uintptr_t>b.scalar_ptrs[i]))[0]) * 1099511628211ULL
            else:
                for d in b.bound_shapes[i]:
                    xor ^= <uint64_t>d
                    h = (h ^ <uint64_t>d) * 1099511628211ULL
        for k in range(self.n_pattern_keys):
            if self.pattern_hashes[k] == h:
                break
        else:
            if self.n_pattern_keys < MAX_PATTERN_KEYS:
                self.pattern_hashes[self.n_pattern_keys] = h
                self.n_pattern_keys += 1
            else:
                h = SHARED_PATTERN_KEY << 2
        n = <int64_t>((xor ^ (h >> 2)) & 0x7FFFFFFFFFFFFFFFULL)  # dims are < 2**63: so is the XOR with them
        if n != b.bound_key:
            if b.iob is None:
                b.set_input(self.n_fed, self.scratch_ptr, (n, 0), 2, 1)  # 2: ONNX uint8
            else:
                b.iob.bind_input(self.pattern_key, self.key_device, 2, (n, 0), self.scratch_ptr)
            b.bound_key = n
        return 0

    cdef _c_names(self, inputs, outputs):
        cdef Py_ssize_t i, k = 0
        self.in_itemsizes = [d.itemsize if d is not None else 0 for d in self.in_dtypes]
        self.out_itemsizes = [t.element_size() for t in self.out_templates]
        if _api == NULL:
            return
        self.c_run_options = CRunOptions()
        self.c_names = [name.encode() if name is not None else None for name in self.in_names] + [n.encode() for n in self.out_names]
        if self.pattern_key is not None:
            self.c_names.append(self.pattern_key.encode())
        self.feed_pos = <Py_ssize_t*>calloc(self.n_args + 1, sizeof(Py_ssize_t))
        self.c_in_names = <const char**>calloc(self.n_args + 1, sizeof(char*))
        self.c_out_names = <const char**>calloc(len(self.out_names) + 1, sizeof(char*))
        if self.feed_pos == NULL or self.c_in_names == NULL or self.c_out_names == NULL:
            raise MemoryError()
        for i in range(self.n_args):
            if self.c_names[i] is None or self.kinds[i] == K_UNUSED or self.kinds[i] == K_FROZEN:
                self.feed_pos[i] = -1
            else:
                self.feed_pos[i] = k
                self.c_in_names[k] = <const char*>self.c_names[i]
                k += 1
        self.n_fed = k
        for i in range(len(self.out_names)):
            self.c_out_names[i] = <const char*>self.c_names[self.n_args + i]
        if self.pattern_key is not None:  # fed last, after the arguments
            self.c_in_names[k] = <const char*>self.c_names[len(self.c_names) - 1]

    def __dealloc__(self):
        free(self.raw_checks)
        free(self.c_kinds)
        free(self.c_static)
        free(self.c_in_raw)
        free(self.c_out_raw)
        free(self.frozen_ptrs)
        free(self.frozen_versions)
        free(self.frozen_itemsizes)
        free(self.feed_pos)
        free(self.c_in_names)
        free(self.c_out_names)
        free(self.varying)

    cdef _Binding _new_binding(self):
        cdef _Binding b = _Binding()
        cdef Py_ssize_t i
        cdef bint c = type(self.sess) is CSession
        b.sess = self.sess
        b.pool = self.pool
        b.bound_ptrs = <uintptr_t*>calloc(self.n_args + 1, sizeof(uintptr_t))
        b.bound_out_ptrs = <uintptr_t*>calloc(len(self.out_names) + 1, sizeof(uintptr_t))
        if b.bound_ptrs == NULL or b.bound_out_ptrs == NULL:
            raise MemoryError()
        b.bound_shapes = [None] * self.n_args
        b.scalar_buffers = [None] * self.n_args
        b.scalar_ptrs = [0] * self.n_args
        b.outputs = [None] * len(self.out_names)
        b.bound_key = -1
        if c:
            b.n_in, b.n_out = self.n_fed + (self.pattern_key is not None), len(self.out_names)
            b.in_values = <OrtValue**>calloc(b.n_in + 1, sizeof(OrtValue*))
            b.out_values = <OrtValue**>calloc(b.n_out + 1, sizeof(OrtValue*))
            b.scalars = <int64_t*>calloc(self.n_args + 1, sizeof(int64_t))
            if b.in_values == NULL or b.out_values == NULL or b.scalars == NULL:
                raise MemoryError()
        else:
            b.iob = self.binding_factory(self.sess)
        for i in range(self.n_args):
            kind = self.kinds[i]
            if kind == K_INT or kind == K_FLOAT or kind == K_BOOL:
                if c:
                    b.scalar_ptrs[i] = <uintptr_t>&b.scalars[i]
                    b.set_input(self.feed_pos[i], b.scalar_ptrs[i], (), self.in_elem_types[i], self.in_itemsizes[i])
                    continue
                buf = torch.zeros((), dtype=self.in_dtypes[i])
                b.scalar_buffers[i] = buf
                b.scalar_ptrs[i] = buf.data_ptr()
                b.iob.bind_input(self.in_names[i], self.in_ort_devices[i], self.in_elem_types[i], (), buf.data_ptr())
        return b

    def __call__(self, *args):
        cdef Py_ssize_t i, n
        cdef _Binding b
        cdef bint boxed_call = False
        n = len(args)
        if self.takes_boxed and n == 1 and type(args[0]) is list:  # boxed call (graph arguments are never lists)
            boxed_call = True
            boxed = args[0]
            args = tuple(boxed)
            boxed.clear()  # lets aot_autograd's inputs be freed as early as in eager
            n = len(args)
        if self.replacement is not None:
            return self.replacement(*args)
        if n != self.n_given:
            raise TypeError(f"ortlite graph {self.name}: expected {self.n_given} arguments, got {n}")
        if self.frozen_indices is not None and self._weights_changed(args):
            self.on_weights_changed(args)  # a new session, or a replacement binding the weights
            if self.replacement is not None:
                return self.replacement(*args)
        if self.stream_of is not None:
            key = self.stream_of()
            if key != self.stream_key:
                self._use_stream(key)
        constants = None
        if self.size_constants is not None:
            try:
                constants = self.size_constants(args)
            except (TypeError, ValueError):  # a bad argument, named
                raise
            except SizesKeepChanging as e:
                self.replace(e.replacement)
                return self.replacement(*args)
            except Exception as e:  # ONNX Runtime failed in the size prelude (an index out of bounds, say)
                return self._after_failure(RunError(
                    f"ortlite: ONNX Runtime failed computing the size constants of graph {self.name}: {e}\n"
                    f"inputs: {self.describe_inputs()}"
                ), args)
        if self.pool:  # oldest first: see recycle_outputs
            b = <_Binding>self.pool[0]
            del self.pool[0]  # (pop(0) would look its method up)
        else:
            b = self._new_binding()
        failed = None
        try:
            if (self.raw_checks != NULL and self._raw_guarded(args)) or (
                    self.guard_check is not None and self.guard_check(*self._tensor_args(args))):
                keep_alive = self._bind_guarded(b, args)
            else:
                keep_alive = self._bind_validated(b, args)
            if constants is not None and constants is not b.bound_constants:
                self._bind_constants(b, constants)
            if self.pattern_key is not None:
                self._bind_pattern_key(b)
            if self.sizes_fn is not None:
                shapes, sizes = self.sizes_fn(args)
            else:
                shapes = sizes = None
            outs = self._bind_outputs(b, shapes)
            error = None
            if not self.out_names:  # a graph of size arithmetic alone has nothing for ORT to run
                pass
            elif b.iob is None:
                error = self._run_c(b)
            else:
                try:
                    b.sess.run_with_iobinding(b.iob, self.run_options)
                except Exception as e:
                    error = e
            if error is not None:
                failed = RunError(
                    f"ortlite: ONNX Runtime failed running graph {self.name}: {error}\n"
                    f"inputs: {self.describe_inputs()}; set ORTLITE_DUMP_DIR to write the model for inspection"
                )
            if failed is None:
                self.runs += 1
                if self.sizes_fn is not None:
                    self._take_ort_allocated(b, outs)
                if self.failure_outputs:
                    failed = self._raise_failures(outs)
        finally:
            b.pool.append(b)  # its own session's pool, even if another thread switched streams
        if failed is not None:
            return self._after_failure(failed, args)
        if self.single_output:
            if not self.returns_tuple:
                return outs[0]
            # boxed (aot_autograd): the list of outputs as it is (it turns a tuple into one)
            return outs if boxed_call and len(outs) == 1 else (outs[0],)
        results = self._results(outs, args, sizes)
        return results if self.returns_tuple else results[0]

    def _after_failure(self, failed, tuple args):
        """A failed run: raise, or (torch.compile) call what on_run_failure gives from now on."""
        if self.on_run_failure is None:
            raise failed
        self.replacement = self.on_run_failure(failed)
        return self.replacement(*args)

    cdef _run_c(self, _Binding b):
        """Runs a CSession on the binding's values; returns the OrtError of a failed run."""
        cdef OrtStatus* status
        cdef OrtSession* sess = (<CSession>b.sess).ptr
        cdef OrtRunOptions* run_options = self.c_run_options.ptr
        with nogil:
            status = _run(sess, run_options, self.c_in_names, <const OrtValue* const*>b.in_values, b.n_in,
                          self.c_out_names, b.n_out, b.out_values)
        if status == NULL:
            return None
        try:
            _check(status)
        except OrtError as e:
            return e

    cdef bint _weights_changed(self, tuple args):
        """Whether a frozen argument is not what the session was built from: another tensor
        object, other memory (`.data =`), written in place since (version counter), or, for
        a buffer, other contents (BatchNorm's kernels write running statistics in place
        without bumping the version counter)."""
        cdef Py_ssize_t k
        cdef uintptr_t ptr
        cdef int64_t version
        cdef bytes contents
        for k in range(len(self.frozen_indices)):
            a = args[<Py_ssize_t>self.frozen_indices[k]]
            if PyWeakref_GetObject(self.frozen_refs[k]) is not <PyObject*>a:
                return True
            if _raw_versions:  # read from the tensor's TensorImpl (-1: no counter)
                version = _raw_version(_impl_of(a))
                ptr = _frozen_ptr(a, self.frozen_itemsizes[k])
            else:
                try:
                    version = _version_of(a)
                except RuntimeError:  # an inference tensor now (e.g. `.data =` one): no counter
                    return True
                ptr = _data_ptr_of(a)
            if version != self.frozen_versions[k] or ptr != self.frozen_ptrs[k]:
                return True
            contents = self.frozen_contents[k]
            if contents is not None and memcmp(<const void*>ptr, <const char*>contents, len(contents)) != 0:
                return True
        return False

    def weights_changed(self, *args):
        """The per-call staleness check alone, on a call's arguments (bench/frozen.py times it)."""
        return self.frozen_indices is not None and self._weights_changed(args)

    def set_frozen(self, list indices, list tensors, sess=None, list contents=None):
        """Watch these arguments (now holding `tensors`) for changes; with sess, run that
        session (built from them) from now on. contents: per tensor, the bytes to compare
        its memory with per call (CPU buffers), or None."""
        self.frozen_refs = [weakref.ref(t, self._weight_died) for t in tensors]
        cdef Py_ssize_t k, n = len(tensors)
        cdef uintptr_t* ptrs = <uintptr_t*>calloc(n + 1, sizeof(uintptr_t))
        cdef int64_t* versions = <int64_t*>calloc(n + 1, sizeof(int64_t))
        cdef Py_ssize_t* itemsizes = <Py_ssize_t*>calloc(n + 1, sizeof(Py_ssize_t))
        if ptrs == NULL or versions == NULL or itemsizes == NULL:
            free(ptrs)
            free(versions)
            free(itemsizes)
            raise MemoryError()
        for k in range(n):
            itemsizes[k] = tensors[k].element_size()
            ptrs[k] = _frozen_ptr(tensors[k], itemsizes[k]) if _raw_versions else tensors[k].data_ptr()
            versions[k] = tensors[k]._version
        free(self.frozen_ptrs)
        free(self.frozen_versions)
        free(self.frozen_itemsizes)
        self.frozen_ptrs, self.frozen_versions, self.frozen_itemsizes = ptrs, versions, itemsizes
        self.frozen_contents = contents if contents is not None else [None] * len(tensors)
        self.frozen_indices = list(indices)
        if sess is not None:
            self._use_session(sess)

    def frozen_tensors(self):
        """Argument index -> the frozen tensor (None if it died), in index order."""
        if self.frozen_indices is None:
            return {}
        return {i: r() for i, r in zip(self.frozen_indices, self.frozen_refs)}

    def replace(self, replacement):
        """Calls go to `replacement` from now on (the graph with its weights bound, or without
        its size prelude); this runner's sessions are released."""
        self.replacement = replacement
        self.frozen_indices = self.frozen_refs = None
        self._release()

    def _weight_died(self, ref):
        """A frozen tensor was freed (model dropped, parameter replaced): so is the session's
        copy of the weights. The next call, if any, sees the change (the dead reference)
        and rebuilds."""
        self._release()

    cdef _release(self):
        """Drop the session(s) and their bindings now: a binding and its pool refer to each
        other, so emptying the old pools frees them without waiting for the cyclic GC."""
        self.pool.clear()
        for _, pool in self.by_stream.values():
            pool.clear()
        self.sess = None
        self.pool = []  # a new list: a binding in use elsewhere returns to its old pool
        self.by_stream = {}

    cdef _use_session(self, sess):
        """sess (made for torch's current stream) replaces the session and its bindings."""
        self._release()
        self.sess = sess
        self.stream_key = self.stream_of() if self.stream_of is not None else None
        if self.recycle_outputs:
            self.pool.extend([self._new_binding(), self._new_binding()])

    cdef _use_stream(self, key):
        self.by_stream[self.stream_key] = (self.sess, self.pool)
        entry = self.by_stream.get(key)
        if entry is None:
            entry = (self.session_for(key), [])
        self.sess, self.pool = entry
        self.stream_key = key

    cdef _raise_failures(self, list outs):
        """Raises aten's runtime error of a true condition; returns a RunError for a true
        to-torch condition (the results are not aten's: torch computes them), else None."""
        cdef Py_ssize_t k
        cdef uintptr_t p
        for k in range(len(self.failure_outputs)):
            p = outs[<Py_ssize_t>self.failure_outputs[k]].data_ptr()
            if (<char*>p)[0] and self.failure_to_torch[k]:
                return RunError(f"ortlite: graph {self.name} cannot give aten's result for these inputs, {self.failure_messages[k]}")
        for k in range(len(self.failure_outputs)):
            p = outs[<Py_ssize_t>self.failure_outputs[k]].data_ptr()
            if (<char*>p)[0]:
                raise RuntimeError(self.failure_messages[k])
        return None

    cdef _take_ort_allocated(self, _Binding b, list outs):
        """Outputs ORT allocated (None in outs) become torch tensors through DLPack. (No
        `None in outs`: that compares tensors with None through torch's __eq__, ~13 µs.)"""
        global _live_values
        cdef Py_ssize_t i
        if b.iob is None:  # the C API: copies, then ORT's values released, even if one copy fails
            made = [i for i in range(len(outs)) if outs[i] is None]
            _live_values += len(made)  # made by Run
            try:
                for i in made:
                    outs[i] = _tensor_of(b.out_values[i], self.out_templates[i], self.out_elem_types[i])
            finally:
                for i in made:
                    b.set_output(i, 0, None, 0, 0)
            return
        allocated = None
        for i in range(len(outs)):
            if outs[i] is None:
                if allocated is None:
                    allocated = b.iob.get_outputs()
                outs[i] = from_dlpack(allocated.dlpack_at(i))

    cdef list _bind_outputs(self, _Binding b, tuple shapes):
        """New (or recycled) output tensors, bound. shapes: per output, from the size
        function (None for a static graph); an output whose shape is None there is left
        to ORT to allocate (see _take_ort_allocated)."""
        cdef Py_ssize_t i
        cdef bint static
        cdef list outs = []
        cdef uintptr_t ptr
        for i in range(len(self.out_names)):
            shape = self.out_shapes[i]
            static = shape is not None
            if not static:
                shape = shapes[i]
                if shape is None:
                    if b.iob is None:
                        b.set_output(i, 0, None, 0, 0)
                    else:
                        b.iob.bind_output(self.out_names[i], self.out_ort_devices[i])
                    outs.append(None)
                    continue
            if self.recycle_outputs:
                last = b.outputs[i]
                if (last is not None
                        and (static or (last.shape == shape and last.nbytes <= self.recycle_max_bytes))
                        and _unobservable(last, b.bound_out_ptrs[i], self.c_out_raw[i] if static else 0)):
                    outs.append(last)
                    continue
            out = empty_like(self.out_templates[i]) if static else self.out_templates[i].new_empty(shape)
            ptr = self._bind_ptr(out, self.c_out_raw[i] if static else 0)
            if b.iob is None:
                b.set_output(i, ptr, shape, self.out_elem_types[i], self.out_itemsizes[i])
            else:
                b.iob.bind_output(self.out_names[i], self.out_ort_devices[i], self.out_elem_types[i], shape, ptr)
            if self.recycle_outputs:
                b.outputs[i] = out
                b.bound_out_ptrs[i] = ptr
            outs.append(out)
        return outs

    cdef list _bind_guarded(self, _Binding b, tuple args):
        """The guard has just checked the type, dtype, device, sizes and strides of every
        tensor argument in one C++ call: only pointers (and dynamic sizes) remain to bind."""
        cdef Py_ssize_t i
        cdef int kind
        cdef uintptr_t ptr
        for i in range(self.n_given):
            kind = self.c_kinds[i]
            a = args[i]
            if kind != K_TENSOR:
                if kind != K_FROZEN and kind != K_UNUSED:
                    self._write_scalar(b, i, kind, a)
            elif self.c_static[i]:
                ptr = self._bind_ptr(a, self.c_in_raw[i])  # raw: the guard checked a plain dense tensor with elements
                if ptr != b.bound_ptrs[i]:
                    self._bind_input(b, i, self.in_shapes[i], ptr)
            else:
                if not a.is_contiguous():  # dynamic dims: the guard does not check strides
                    return self._bind_validated(b, args)
                shape = a.shape
                ptr = self._bind_ptr(a, 0)
                if ptr != b.bound_ptrs[i] or shape != b.bound_shapes[i]:
                    self._bind_input(b, i, shape, ptr)
        return None

    cdef _bind_constants(self, _Binding b, tuple constants):
        """The size constants' tensors, bound after the arguments: made by SizeConstants
        (contiguous, of the dtypes the prelude gives the model), not checked. The same tuple
        comes back while sizes repeat, and a binding that bound it skips this."""
        cdef Py_ssize_t k, i
        cdef uintptr_t ptr
        for k in range(len(constants)):
            i = self.n_given + k
            t = constants[k]
            shape = t.shape
            ptr = self._bind_ptr(t, 0)
            if ptr != b.bound_ptrs[i] or shape != b.bound_shapes[i]:
                self._bind_input(b, i, shape, ptr)
        b.bound_constants = constants

    cdef bint _raw_guarded(self, tuple args):
        cdef Py_ssize_t k
        for k in range(self.n_raw_checks):
            if not _raw_matches(args[self.raw_checks[k].arg], &self.raw_checks[k]):
                return False
        return True

    cdef _build_raw_checks(self, tuple args):
        """From arguments that have just passed validation: a raw check (see _raw_matches) per
        tensor argument, where every one is a static-shaped CPU tensor (a plain Tensor or
        Parameter, with storage) of at most MAX_RAW_DIMS dims and the layouts checked out at
        import."""
        cdef Py_ssize_t i, k = 0
        self.raw_tried = True
        tensors = [i for i in range(self.n_given) if self.c_kinds[i] == K_TENSOR]
        if not _raw_guard or not tensors or any(
                not self.c_static[i] or self.in_device_index[i] != -1 or len(self.in_shapes[i]) > MAX_RAW_DIMS
                or (type(args[i]) is not Tensor and type(args[i]) is not _Parameter)  # no subclass's own layout
                or _storage_impl_of(_impl_of(args[i])) == NULL
                for i in tensors):
            return
        checks = <RawCheck*>calloc(len(tensors), sizeof(RawCheck))
        if checks == NULL:
            raise MemoryError()
        try:
            for i in tensors:
                _raw_check_of(&checks[k], args[i], i)
                k += 1
        except BaseException:
            free(checks)
            raise
        self.raw_types = [type(args[i]) for i in tensors]
        self.raw_checks, self.n_raw_checks = checks, len(tensors)

    cdef inline _write_scalar(self, _Binding b, Py_ssize_t i, int kind, a):
        """Python numbers go into 0-d buffers bound once; UNUSED arguments are ignored."""
        cdef uintptr_t p = b.scalar_ptrs[i]
        if kind == K_INT:
            (<int64_t*>p)[0] = a
        elif kind == K_FLOAT:
            (<double*>p)[0] = a
        elif kind == K_BOOL:
            (<char*>p)[0] = 1 if a else 0

    cdef tuple _tensor_args(self, tuple args):
        if self.all_tensors:
            return args
        return tuple([args[i] for i in self.tensor_indices])

    cdef inline uintptr_t _bind_ptr(self, object t, Py_ssize_t raw_itemsize) except? 0:
        """The address to bind for tensor t: read from torch's objects where raw_itemsize (its
        element size: a dense tensor with elements, _raw_data, see c_in_raw), else its
        data_ptr(), the scratch buffer's for an empty tensor (whose data_ptr() is 0)."""
        cdef uintptr_t ptr
        if raw_itemsize:
            return _raw_data_ptr(t, raw_itemsize)
        ptr = _data_ptr_of(t)
        return ptr if ptr != 0 else self.scratch_ptr

    cdef inline _bind_input(self, _Binding b, Py_ssize_t i, shape, uintptr_t ptr):
        if b.iob is None:
            b.set_input(self.feed_pos[i], ptr, shape, self.in_elem_types[i], self.in_itemsizes[i])
        else:
            b.iob.bind_input(self.in_names[i], self.in_ort_devices[i], self.in_elem_types[i], shape, ptr)
        b.bound_ptrs[i] = ptr
        b.bound_shapes[i] = shape

    cdef list _bind_validated(self, _Binding b, tuple args):
        """Check each argument against the schema, make it contiguous, bind it. Returns
        the contiguous copies made (kept alive until the run ends)."""
        cdef Py_ssize_t i
        cdef int kind
        cdef uintptr_t p
        cdef bint copied = False
        cdef uintptr_t ptr
        keep_alive = []
        for i in range(self.n_given):
            kind = self.kinds[i]
            a = args[i]
            if kind == K_TENSOR:
                if not isinstance(a, Tensor) or a.dtype is not self.in_dtypes[i] or not self._device_ok(i, a):
                    self._mismatch(i, a)
                shape = a.shape
                if self.in_static[i]:
                    if shape != self.in_shapes[i]:
                        self._mismatch(i, a)
                elif not self._dims_ok(i, shape):
                    self._mismatch(i, a)
                if a.layout is not _strided or (self.plain_tensors and _overrides_torch_function(a)):
                    self._mismatch(i, a)
                if not a.is_contiguous() or _lazy(a):
                    a = _materialized(a)
                    keep_alive.append(a)
                ptr = self._bind_ptr(a, 0)
                if ptr != b.bound_ptrs[i] or shape != b.bound_shapes[i]:
                    self._bind_input(b, i, shape, ptr)
            else:
                self._write_scalar(b, i, kind, a)
        if not self.raw_tried and not keep_alive:
            self._build_raw_checks(args)
        if self.guard is None and self.guard_factory is not None and not keep_alive:
            # Tensors like these pass the guard from now on: one C++ check for all.
            self.guard = self.guard_factory(self._tensor_args(args))
            self.guard_check = self.guard.check if self.guard is not None else None
            self.guard_factory = None
        return keep_alive

    cdef tuple _results(self, list outs, tuple args, sizes):
        cdef Py_ssize_t i, n = len(self.plan_source)
        results = []
        for i in range(n):
            source = self.plan_source[i]
            if source == S_ORT:
                r = outs[self.plan_index[i]]
                results.append(r.item() if self.plan_scalar[i] else r)
            elif source == S_INPUT:
                results.append(args[self.plan_index[i]])
            elif source == S_SYM:
                results.append(sizes[self.plan_index[i]])
            else:
                results.append(self.plan_value[i])
        return tuple(results)

    cdef bint _device_ok(self, Py_ssize_t i, a):
        index = self.in_device_index[i]
        if index == -1:
            return a.is_cpu
        return a.is_cuda and a.get_device() == index

    cdef bint _dims_ok(self, Py_ssize_t i, shape):
        expected = self.in_shapes[i]
        if len(shape) != len(expected):
            return False
        for got, want in zip(shape, expected):
            if want != -1 and got != want:
                return False
        return True

    cdef _mismatch(self, Py_ssize_t i, a):
        from ortlite.runner import describe_mismatch
        raise describe_mismatch(self.name, i, self.in_names[i], self.in_dtypes[i], self.in_device_index[i], self.in_shapes[i], a)

    @property
    def raw_guarded(self):
        """Whether the guarded path checks arguments from their TensorImpls (not TensorGuards)."""
        return self.raw_checks != NULL

    def fed_pattern_key(self):
        """The first dim of the memory-pattern key input at the last call (None: the graph has none)."""
        if self.pattern_key is None or not self.pool:
            return None
        return (<_Binding>self.pool[len(self.pool) - 1]).bound_key

    @property
    def uses_c_api(self):
        """Whether the session (for the current stream) runs through ONNX Runtime's C API."""
        return type(self.sess) is CSession

    @property
    def providers(self):
        """The execution providers of the session (for the current stream)."""
        return list(self.sess.get_providers())

    def describe_inputs(self):
        return [
            (self.in_names[i], str(self.in_dtypes[i]), self.in_shapes[i])
            for i in range(self.n_args) if self.kinds[i] == K_TENSOR
        ]
