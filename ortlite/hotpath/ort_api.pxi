# ONNX Runtime's C API (declared in ortlite/_ort.pxd): loading the library, sessions, run
# options, and OrtValues over torch's memory. Included by ortlite/_fast.pyx; the classes'
# fields are declared in ortlite/_fast.pxd.

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

    def __dealloc__(self):
        if self.ptr != NULL:
            (<ReleaseFn>_api[SLOT_ReleaseSession])(self.ptr)

    def get_providers(self):
        return list(self.providers)


cdef class CFloor:
    """bench/overhead.py's C-API floor: Run on OrtValues made once over these tensors."""

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


