# The hot path's classes as C sees them: their fields and the C-level methods one calls on
# another. The code is in ortlite/_fast.pyx and the files it includes from ortlite/hotpath/
# (one extension module, so calls between them stay direct C calls).

from libc.stdint cimport int64_t, uint16_t, uint64_t, uintptr_t

from ortlite._ort cimport OrtRunOptions, OrtSession, OrtValue

cdef enum:
    MAX_RAW_DIMS = 5  # the raw tensor check (RawCheck) covers tensors of at most this many dims
    # ONNX Runtime keeps every memory plan it makes, and each holds memory about the size of
    # the run's intermediates: a session fed ever new sizes grows without bound (16k batch
    # sizes of an 8-layer MLP: 17 GB). A runner gives this many sets of sizes a plan of their
    # own; all later ones share one more (ORT then allocates what does not fit it one by one).
    MAX_PATTERN_KEYS = 4


# ---- ONNX Runtime's C API: hotpath/ort_api.pxi ----

cdef class CRunOptions:
    cdef OrtRunOptions* ptr


cdef class CSession:
    cdef OrtSession* ptr
    cdef readonly list providers


cdef class CFloor:
    cdef CSession sess
    cdef CRunOptions run_options
    cdef list keep
    cdef Py_ssize_t n_in, n_out
    cdef const char** names
    cdef OrtValue** values


# ---- torch's tensors: hotpath/tensor_access.pxi ----

ctypedef struct RawCheck:  # what _raw_matches compares a tensor argument with
    Py_ssize_t arg
    void* pytype
    uint64_t keys
    uint16_t dtype
    Py_ssize_t ndim
    int64_t sizes[MAX_RAW_DIMS]
    int64_t strides[MAX_RAW_DIMS]


# ---- a call's arguments: hotpath/arguments.pxi ----

cdef class _Binding:
    cdef object sess             # the session it belongs to, and the pool it goes back to
    cdef list pool
    cdef object iob
    cdef OrtValue** in_values    # per fed argument
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

    cdef int set_input(self, Py_ssize_t i, uintptr_t ptr, shape, int elem_type, Py_ssize_t itemsize) except -1
    cdef int set_output(self, Py_ssize_t i, uintptr_t ptr, shape, int elem_type, Py_ssize_t itemsize) except -1


cdef class _Inputs:
    cdef str graph               # the graph's name, for errors
    cdef Py_ssize_t n_args
    cdef Py_ssize_t n_given      # arguments a call passes (n_args less the size constants)
    cdef Py_ssize_t n_fed        # arguments ORT gets a value for (not unused, not frozen)
    cdef list kinds
    cdef list names
    cdef list dtypes
    cdef list elem_types
    cdef list ort_devices
    cdef list device_index       # -1 for CPU, N for cuda:N
    cdef list shapes             # expected shape; -1 marks a dynamic dim
    cdef list static             # bool: every dim static
    cdef list itemsizes
    cdef int* c_kinds            # kinds, per argument, as a C array
    cdef char* c_static          # static, likewise
    cdef Py_ssize_t* c_raw       # per argument: its element size where its data pointer can be read
                                 # directly (_raw_data; a static tensor with elements), else 0
    cdef Py_ssize_t* feed_pos    # per argument: its position among the fed ones, -1 for none
    cdef const char** c_names    # per fed argument (then the pattern key's)
    cdef list c_name_bytes       # the bytes c_names point into
    cdef uintptr_t scratch_ptr   # bound in place of zero-element tensors (their data_ptr is 0)
    cdef object guard_check      # the guard's check: all tensor arguments at once (torch's TensorGuards)
    cdef object guard_factory    # builds the guard from the first arguments that pass validation
    cdef RawCheck* raw_checks    # the same check read from the TensorImpls (_raw_matches); NULL: none
    cdef Py_ssize_t n_raw_checks
    cdef bint raw_tried          # raw_checks were built, or could not be
    cdef list raw_types          # the Python types raw_checks point to
    cdef list tensor_indices     # the guard checks these arguments
    cdef bint all_tensors
    cdef bint plain_tensors      # refuse tensor subclasses with a __torch_function__ of their own
    cdef object pattern_key      # the name of the memory-pattern key input (ortlite.lower._sizes_vary); None: none
    cdef object key_device       # its OrtDevice (the pybind binding's)
    cdef uint64_t static_dims_xor   # the XOR of the static fed tensors' dims, ORT's part of the key we know
    cdef Py_ssize_t* varying        # the dynamic tensor and int arguments, which the key hashes
    cdef Py_ssize_t n_varying
    cdef uint64_t pattern_hashes[MAX_PATTERN_KEYS]  # the sets of sizes with a plan of their own
    cdef Py_ssize_t n_pattern_keys

    cdef _Binding new_binding(self, sess, list pool, Py_ssize_t n_out, binding_factory)
    cdef list bind(self, _Binding b, tuple args)
    cdef bind_constants(self, _Binding b, tuple constants)
    cdef int bind_pattern_key(self, _Binding b) except -1
    cdef _key_inputs(self, pattern_key)
    cdef _feed_names(self)
    cdef bint _any_nested(self, tuple args)
    cdef list _bind_guarded(self, _Binding b, tuple args)
    cdef list _bind_validated(self, _Binding b, tuple args)
    cdef inline _bind_input(self, _Binding b, Py_ssize_t i, shape, uintptr_t ptr)
    cdef inline _write_scalar(self, _Binding b, Py_ssize_t i, int kind, a)
    cdef bint _raw_guarded(self, tuple args)
    cdef _build_raw_checks(self, tuple args)
    cdef tuple _tensor_args(self, tuple args)
    cdef bint _device_ok(self, Py_ssize_t i, a)
    cdef bint _dims_ok(self, Py_ssize_t i, shape)
    cdef _mismatch(self, Py_ssize_t i, a)


# ---- outputs, frozen weights, the runner: hotpath/runner.pxi ----

cdef class _Outputs:
    cdef Py_ssize_t n
    cdef list names
    cdef list elem_types
    cdef list ort_devices
    cdef list templates          # tensors whose empty_like is the output buffer
    cdef list shapes             # None where symbolic (the size function gives it per call)
    cdef list itemsizes
    cdef Py_ssize_t* c_raw       # per output: its element size where its data pointer can be read directly, else 0
    cdef const char** c_names
    cdef list c_name_bytes
    cdef bint recycle            # refill a binding's previous outputs when nothing can observe them
    cdef Py_ssize_t recycle_max_bytes
    cdef uintptr_t scratch_ptr
    cdef list inplace_arg        # per output: the argument whose memory ORT writes it into, -1 for none
    cdef bint any_inplace

    cdef list bind(self, _Binding b, tuple shapes)
    cdef bind_inplace(self, _Binding b, tuple args, _Inputs inputs, list outs)
    cdef take_ort_allocated(self, _Binding b, list outs)


cdef class _FrozenWeights:
    cdef list indices            # arguments that are initializers of the session
    cdef list refs               # weak references to the tensors the session was built from
    cdef uintptr_t* ptrs         # their data pointers and version counters then
    cdef int64_t* versions
    cdef Py_ssize_t* itemsizes
    cdef list contents           # bytes of a buffer's contents then (None for a parameter)

    cdef bint changed(self, tuple args)


cdef class Runner:
    cdef readonly str name
    cdef _Inputs inputs
    cdef _Outputs outputs
    cdef _FrozenWeights frozen   # None: no argument is an initializer of the session
    cdef object sess
    cdef object run_options
    cdef CRunOptions c_run_options  # for CSessions
    cdef object binding_factory  # session -> a new pybind SessionIOBinding
    cdef list pool
    cdef object stream_of        # CUDA graphs: () -> a key of torch's current stream; else None
    cdef object session_for      # stream key -> a session running on that stream
    cdef object stream_key
    cdef dict by_stream          # stream key -> (session, binding pool)
    cdef object scratch          # (kept alive: its memory is bound for zero-element tensors)
    cdef list plan_source
    cdef list plan_index
    cdef list plan_value
    cdef list plan_scalar
    cdef bint single_output      # the graph returns exactly one ORT output, as a 1-tuple
    cdef bint returns_tuple      # False: return the single result bare (fused FX submodules)
    cdef object sizes_fn         # symbolic sizes: args -> (output shapes, size outputs); None when static
    cdef list failure_outputs    # ORT output indices of 0-d bool (CPU) conditions: raise when true
    cdef list failure_messages
    cdef list failure_errors     # per condition: the exception type to raise; None: fail the run (on_run_failure)
    cdef bint takes_boxed        # built for aot_autograd's boxed calls: one list argument, cleared
    cdef readonly object size_constants  # args -> tensors, the inputs after the arguments (ortlite.lower.hoist); None: none
    cdef object replacement      # once set (ORT failed, weights keep changing, sizes keep changing): calls go to it
    cdef public long runs
    cdef public object on_weights_changed  # args -> None: refreezes (set_frozen) or replaces the runner
    cdef public object on_run_failure  # RunError -> a callable to run this graph from now on (or raise)
    cdef object __weakref__
    cdef dict __dict__  # holds _boxed_call, so that wrappers made with functools.wraps keep it

    cdef _Binding _new_binding(self)
    cdef _run_c(self, _Binding b)
    cdef _raise_failures(self, list outs)
    cdef tuple _results(self, list outs, tuple args, sizes)
    cdef _release(self)
    cdef _use_session(self, sess)
    cdef _use_stream(self, key)
