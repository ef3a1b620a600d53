# ONNX Runtime's C API, as much of it as ortlite/_fast.pyx uses. No header ships with the
# wheel, so these are our own declarations. OrtApi is a table of function pointers whose slot
# order is the ABI (append-only across versions); _fast.pyx reads the entries it needs by
# slot number from the table GetApi(ORT_API_VERSION_USED) returns.

from libc.stdint cimport int64_t, uint32_t

# Opaque handles.
ctypedef void OrtEnv
ctypedef void OrtStatus
ctypedef void OrtMemoryInfo
ctypedef void OrtSession
ctypedef void OrtValue
ctypedef void OrtRunOptions
ctypedef void OrtTensorTypeAndShapeInfo
ctypedef void OrtSessionOptions

ctypedef const void* (*GetApiFn)(uint32_t version) noexcept nogil
ctypedef const char* (*GetVersionStringFn)() noexcept nogil

ctypedef struct OrtApiBase:
    GetApiFn GetApi
    GetVersionStringFn GetVersionString

ctypedef const OrtApiBase* (*OrtGetApiBaseFn)() noexcept nogil

# Every slot used exists since API version 13 (ORT 1.13).
cdef enum:
    ORT_API_VERSION_USED = 13

# Slot numbers in the OrtApi table, and the signature of each entry used.
cdef enum:
    SLOT_GetErrorCode = 1
    SLOT_GetErrorMessage = 2
    SLOT_CreateEnv = 3
    SLOT_CreateSessionFromArray = 8
    SLOT_Run = 9
    SLOT_CreateSessionOptions = 10
    SLOT_SetSessionLogSeverityLevel = 22
    SLOT_SetSessionGraphOptimizationLevel = 23
    SLOT_SetIntraOpNumThreads = 24
    SLOT_SetInterOpNumThreads = 25
    SLOT_CreateRunOptions = 39
    SLOT_RunOptionsSetRunLogSeverityLevel = 41
    SLOT_CreateTensorWithDataAsOrtValue = 49
    SLOT_GetTensorMutableData = 51
    SLOT_GetTensorElementType = 60
    SLOT_GetDimensionsCount = 61
    SLOT_GetDimensions = 62
    SLOT_GetTensorTypeAndShape = 65
    SLOT_CreateCpuMemoryInfo = 69
    SLOT_ReleaseEnv = 92
    SLOT_ReleaseStatus = 93
    SLOT_ReleaseMemoryInfo = 94
    SLOT_ReleaseSession = 95
    SLOT_ReleaseValue = 96
    SLOT_ReleaseRunOptions = 97
    SLOT_ReleaseTensorTypeAndShapeInfo = 99
    SLOT_ReleaseSessionOptions = 100
    SLOT_AddSessionConfigEntry = 130
    SLOT_AddRunConfigEntry = 165
    SLOT_AddExternalInitializers = 210

# enum values from the C API
cdef enum:
    ORT_LOGGING_LEVEL_FATAL = 4
    OrtArenaAllocator = 1
    OrtMemTypeDefault = 0

ctypedef int (*GetErrorCodeFn)(const OrtStatus*) noexcept nogil
ctypedef const char* (*GetErrorMessageFn)(const OrtStatus*) noexcept nogil
ctypedef OrtStatus* (*CreateEnvFn)(int level, const char* logid, OrtEnv** out) noexcept nogil
ctypedef OrtStatus* (*CreateSessionFromArrayFn)(const OrtEnv*, const void* data, size_t length,
                                                const OrtSessionOptions*, OrtSession** out) noexcept nogil
ctypedef OrtStatus* (*RunFn)(OrtSession*, const OrtRunOptions*, const char* const* input_names,
                             const OrtValue* const* inputs, size_t n_inputs, const char* const* output_names,
                             size_t n_outputs, OrtValue** outputs) noexcept nogil
ctypedef OrtStatus* (*CreateSessionOptionsFn)(OrtSessionOptions** out) noexcept nogil
ctypedef OrtStatus* (*SessionOptionsIntFn)(OrtSessionOptions*, int) noexcept nogil
ctypedef OrtStatus* (*CreateRunOptionsFn)(OrtRunOptions** out) noexcept nogil
ctypedef OrtStatus* (*RunOptionsIntFn)(OrtRunOptions*, int) noexcept nogil
ctypedef OrtStatus* (*CreateTensorWithDataFn)(const OrtMemoryInfo*, void* data, size_t data_len, const int64_t* shape,
                                              size_t rank, int elem_type, OrtValue** out) noexcept nogil
ctypedef OrtStatus* (*GetTensorMutableDataFn)(OrtValue*, void** out) noexcept nogil
ctypedef OrtStatus* (*GetTensorElementTypeFn)(const OrtTensorTypeAndShapeInfo*, int* out) noexcept nogil
ctypedef OrtStatus* (*GetDimensionsCountFn)(const OrtTensorTypeAndShapeInfo*, size_t* out) noexcept nogil
ctypedef OrtStatus* (*GetDimensionsFn)(const OrtTensorTypeAndShapeInfo*, int64_t* dims, size_t n) noexcept nogil
ctypedef OrtStatus* (*GetTensorTypeAndShapeFn)(const OrtValue*, OrtTensorTypeAndShapeInfo** out) noexcept nogil
ctypedef OrtStatus* (*CreateCpuMemoryInfoFn)(int allocator_type, int mem_type, OrtMemoryInfo** out) noexcept nogil
ctypedef void (*ReleaseFn)(void*) noexcept nogil
ctypedef OrtStatus* (*AddConfigEntryFn)(void* options, const char* key, const char* value) noexcept nogil
ctypedef OrtStatus* (*AddExternalInitializersFn)(OrtSessionOptions*, const char* const* names,
                                                 const OrtValue* const* values, size_t n) noexcept nogil
