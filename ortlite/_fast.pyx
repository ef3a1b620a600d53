# cython: language_level=3, boundscheck=False, wraparound=False
"""The per-call hot path: check arguments against the session's input schema, bind them
by data pointer, allocate and bind outputs, run, and hand results back.

Everything that can be is computed once, when the Runner is built (ortlite/runner.py).
Per call it touches only the arguments, the pybind session and an IOBinding taken from
a small pool (one per concurrent caller: bindings are not thread-safe).
"""

import types
import weakref

from cpython.object cimport PyObject
from cpython.ref cimport Py_REFCNT
from libc.stdint cimport int64_t, uintptr_t
from libc.string cimport memcmp

import torch

cdef object Tensor = torch.Tensor
cdef object empty_like = torch.empty_like
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


ARG_KINDS = {"tensor": K_TENSOR, "int": K_INT, "float": K_FLOAT, "bool": K_BOOL, "unused": K_UNUSED, "frozen": K_FROZEN}
OUTPUT_SOURCES = {"ort": S_ORT, "input": S_INPUT, "const": S_CONST, "sym": S_SYM}


cdef class _Binding:
    """One IOBinding plus what was last bound to it, and buffers for scalar arguments."""
    cdef object sess             # the session it belongs to, and the pool it goes back to
    cdef list pool
    cdef object iob
    cdef list bound_ptrs
    cdef list bound_shapes
    cdef list scalar_buffers     # 0-d tensors, bound once, written in place per call
    cdef list scalar_ptrs
    cdef list outputs            # the output tensors bound last (kept only when recycling)
    cdef list bound_out_ptrs


cdef object _storage_use_count = torch._C._storage_Use_Count


def _storage_count_of_a_fresh_tensor():
    # The count the check below sees for a storage only one tensor uses (the temporary
    # Python storage object it creates may hold a reference of its own).
    t = torch.empty(1)
    return _storage_use_count(t.untyped_storage()._cdata)


cdef Py_ssize_t _SOLE_STORAGE_COUNT = _storage_count_of_a_fresh_tensor()


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


cdef inline bint _unobservable(object t, uintptr_t ptr):
    """True when nothing but the binding can reach tensor t or its memory: no other Python
    reference, no C++ reference (autograd, views, DLPack), no other user of its storage,
    no weak reference, no attributes, unchanged memory. Refilling it is then invisible."""
    return (
        Py_REFCNT(t) == 2  # the binding's list and this function's argument
        and type(t) is Tensor
        and not _has_weakrefs(t)
        and t._use_count() == 1
        and not t.requires_grad
        and t.data_ptr() == ptr
        and _storage_use_count(t.untyped_storage()._cdata) == _SOLE_STORAGE_COUNT
        and not t.__dict__
    )


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
    cdef list frozen_ptrs       # their data pointers and version counters then
    cdef list frozen_versions
    cdef list frozen_contents   # bytes of a buffer's contents then (None for a parameter)
    cdef public object on_weights_changed  # args -> None: refreezes (set_frozen) or unfreezes
    cdef public object on_run_failure  # RunError -> a callable to run this graph from now on (or raise)
    cdef object replacement     # that callable, once ORT has failed: calls go to it
    cdef object __weakref__
    cdef dict __dict__  # holds _boxed_call, so that wrappers made with functools.wraps keep it

    def __init__(self, str name, sess, run_options, binding_factory, inputs, outputs, plan, scratch,
                 guard_factory=None, bint returns_tuple=True, bint boxed=False, bint recycle_outputs=False,
                 sizes_fn=None, Py_ssize_t recycle_max_bytes=0, stream_of=None, session_for=None, failures=()):
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
        on_run_failure (attribute): when ORT fails a run, called with the RunError; what it
            returns takes (*args) and runs the graph from then on, this call included.
            None: the RunError is raised."""
        self.name = name
        self.sess = sess
        self.run_options = run_options
        self.binding_factory = binding_factory
        self.n_args = len(inputs)
        self.kinds = [i[0] for i in inputs]
        self.in_names = [i[1] for i in inputs]
        self.in_dtypes = [i[2] for i in inputs]
        self.in_elem_types = [i[3] for i in inputs]
        self.in_ort_devices = [i[4] for i in inputs]
        self.in_device_index = [i[5] for i in inputs]
        self.in_shapes = [tuple(i[6]) if i[6] is not None else None for i in inputs]
        self.in_static = [i[6] is not None and -1 not in i[6] for i in inputs]
        self.out_names = [o[0] for o in outputs]
        self.out_elem_types = [o[1] for o in outputs]
        self.out_ort_devices = [o[2] for o in outputs]
        self.out_templates = [o[3] for o in outputs]
        self.out_shapes = [tuple(o[4]) if o[4] is not None else None for o in outputs]
        self.plan_source = [p[0] for p in plan]
        self.plan_index = [p[1] for p in plan]
        self.plan_value = [p[2] for p in plan]
        self.plan_scalar = [p[3] for p in plan]
        self.single_output = len(plan) == 1 and plan[0][0] == S_ORT and not plan[0][3]
        self.returns_tuple = returns_tuple
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
        if recycle_outputs:  # two bindings used in turn: the caller usually still holds the last result
            self.pool.extend([self._new_binding(), self._new_binding()])
        self.guard_factory = guard_factory
        self.tensor_indices = [i for i in range(self.n_args) if self.kinds[i] == K_TENSOR]
        self.all_tensors = len(self.tensor_indices) == self.n_args
        self.failure_outputs = [f[0] for f in failures]
        self.failure_messages = [f[1] for f in failures]
        self.failure_to_torch = [f[2] for f in failures]

    cdef _Binding _new_binding(self):
        cdef _Binding b = _Binding()
        cdef Py_ssize_t i
        b.sess = self.sess
        b.pool = self.pool
        b.iob = self.binding_factory(self.sess)
        b.bound_ptrs = [None] * self.n_args
        b.bound_shapes = [None] * self.n_args
        b.scalar_buffers = [None] * self.n_args
        b.scalar_ptrs = [0] * self.n_args
        b.outputs = [None] * len(self.out_names)
        b.bound_out_ptrs = [0] * len(self.out_names)
        for i in range(self.n_args):
            kind = self.kinds[i]
            if kind == K_INT or kind == K_FLOAT or kind == K_BOOL:
                buf = torch.zeros((), dtype=self.in_dtypes[i])
                b.scalar_buffers[i] = buf
                b.scalar_ptrs[i] = buf.data_ptr()
                b.iob.bind_input(self.in_names[i], self.in_ort_devices[i], self.in_elem_types[i], (), buf.data_ptr())
        return b

    def __call__(self, *args):
        cdef Py_ssize_t i, n
        cdef _Binding b
        n = len(args)
        if n == 1 and type(args[0]) is list:  # boxed call (graph arguments are never lists)
            boxed = args[0]
            args = tuple(boxed)
            boxed.clear()  # lets aot_autograd's inputs be freed as early as in eager
            n = len(args)
        if self.replacement is not None:
            return self.replacement(*args)
        if n != self.n_args:
            raise TypeError(f"ortlite graph {self.name}: expected {self.n_args} arguments, got {n}")
        if self.frozen_indices is not None and self._weights_changed(args):
            self.on_weights_changed(args)  # a new session, or a replacement binding the weights
            if self.replacement is not None:
                return self.replacement(*args)
        if self.stream_of is not None:
            key = self.stream_of()
            if key != self.stream_key:
                self._use_stream(key)
        b = self.pool.pop(0) if self.pool else self._new_binding()  # oldest first: see recycle_outputs
        failed = None
        try:
            if self.guard is not None and self.guard.check(*self._tensor_args(args)):
                keep_alive = self._bind_guarded(b, args)
            else:
                keep_alive = self._bind_validated(b, args)
            if self.sizes_fn is not None:
                shapes, sizes = self.sizes_fn(args)
            else:
                shapes = sizes = None
            outs = self._bind_outputs(b, shapes)
            try:
                if self.out_names:  # a graph of size arithmetic alone has nothing for ORT to run
                    b.sess.run_with_iobinding(b.iob, self.run_options)
            except Exception as e:
                failed = RunError(
                    f"ortlite: ONNX Runtime failed running graph {self.name}: {e}\n"
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
            if self.on_run_failure is None:
                raise failed
            self.replacement = self.on_run_failure(failed)
            return self.replacement(*args)
        if self.single_output:
            return (outs[0],) if self.returns_tuple else outs[0]
        results = self._results(outs, args, sizes)
        return results if self.returns_tuple else results[0]

    cdef bint _weights_changed(self, tuple args):
        """Whether a frozen argument is not what the session was built from: another tensor
        object, other memory (`.data =`), written in place since (version counter), or, for
        a buffer, other contents (BatchNorm's kernels write running statistics in place
        without bumping the version counter)."""
        cdef Py_ssize_t k
        cdef uintptr_t ptr
        cdef bytes contents
        for k in range(len(self.frozen_indices)):
            a = args[<Py_ssize_t>self.frozen_indices[k]]
            if PyWeakref_GetObject(self.frozen_refs[k]) is not <PyObject*>a:
                return True
            try:
                version = _version_of(a)
            except RuntimeError:  # an inference tensor now (e.g. `.data =` one): no counter
                return True
            if <int64_t>version != <int64_t>self.frozen_versions[k]:
                return True
            ptr = _data_ptr_of(a)
            if ptr != <uintptr_t>self.frozen_ptrs[k]:
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
        self.frozen_ptrs = [t.data_ptr() for t in tensors]
        self.frozen_versions = [t._version for t in tensors]
        self.frozen_contents = contents if contents is not None else [None] * len(tensors)
        self.frozen_indices = list(indices)
        if sess is not None:
            self._use_session(sess)

    def frozen_tensors(self):
        """Argument index -> the frozen tensor (None if it died), in index order."""
        if self.frozen_indices is None:
            return {}
        return {i: r() for i, r in zip(self.frozen_indices, self.frozen_refs)}

    def unfreeze(self, replacement):
        """Calls go to `replacement` (the graph with its weights bound) from now on."""
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
        cdef Py_ssize_t i
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
        for i in range(len(self.out_names)):
            shape = self.out_shapes[i]
            static = shape is not None
            if not static:
                shape = shapes[i]
                if shape is None:
                    b.iob.bind_output(self.out_names[i], self.out_ort_devices[i])
                    outs.append(None)
                    continue
            if self.recycle_outputs:
                last = b.outputs[i]
                if (last is not None
                        and (static or (last.shape == shape and last.nbytes <= self.recycle_max_bytes))
                        and _unobservable(last, b.bound_out_ptrs[i])):
                    outs.append(last)
                    continue
            out = empty_like(self.out_templates[i]) if static else self.out_templates[i].new_empty(shape)
            ptr = out.data_ptr() or self.scratch_ptr
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
        for i in range(self.n_args):
            kind = self.kinds[i]
            a = args[i]
            if kind != K_TENSOR:
                self._write_scalar(b, i, kind, a)
            elif self.in_static[i]:
                ptr = a.data_ptr() or self.scratch_ptr
                if ptr != b.bound_ptrs[i]:
                    self._bind_input(b, i, self.in_shapes[i], ptr)
            else:
                if not a.is_contiguous():  # dynamic dims: the guard does not check strides
                    return self._bind_validated(b, args)
                shape = a.shape
                ptr = a.data_ptr() or self.scratch_ptr
                if ptr != b.bound_ptrs[i] or shape != b.bound_shapes[i]:
                    self._bind_input(b, i, shape, ptr)
        return None

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

    cdef inline _bind_input(self, _Binding b, Py_ssize_t i, shape, ptr):
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
        keep_alive = []
        for i in range(self.n_args):
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
                if not a.is_contiguous():
                    a = a.contiguous()
                    keep_alive.append(a)
                ptr = a.data_ptr() or self.scratch_ptr
                if ptr != b.bound_ptrs[i] or shape != b.bound_shapes[i]:
                    self._bind_input(b, i, shape, ptr)
            else:
                self._write_scalar(b, i, kind, a)
        if self.guard is None and self.guard_factory is not None and not keep_alive:
            # Tensors like these pass the guard from now on: one C++ check for all.
            self.guard = self.guard_factory(self._tensor_args(args))
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
    def providers(self):
        """The execution providers of the session (for the current stream)."""
        return list(self.sess.get_providers())

    def describe_inputs(self):
        return [
            (self.in_names[i], str(self.in_dtypes[i]), self.in_shapes[i])
            for i in range(self.n_args) if self.kinds[i] == K_TENSOR
        ]
