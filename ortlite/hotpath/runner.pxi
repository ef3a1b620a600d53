# The per-call path: a Runner checks and binds a call's arguments (_Inputs), allocates or
# recycles its outputs (_Outputs), checks its frozen weights (_FrozenWeights), runs the
# session and hands results back. Included by ortlite/_fast.pyx; fields in _fast.pxd.


cdef class _Outputs:
    """The graph's ONNX outputs: their buffers, allocated per call or recycled."""

    def __init__(self, outputs, uintptr_t scratch_ptr, bint recycle, Py_ssize_t recycle_max_bytes, inplace=()):
        """outputs: (name, elem_type, ort_device, template, shape) per ONNX output. recycle,
        recycle_max_bytes: see Runner's recycle_outputs. inplace: see Runner's."""
        cdef Py_ssize_t k
        self.n = len(outputs)
        self.inplace_arg = [-1] * self.n
        for k, arg in inplace:
            self.inplace_arg[k] = arg
        self.any_inplace = bool(inplace)
        self.names = [o[0] for o in outputs]
        self.elem_types = [o[1] for o in outputs]
        self.ort_devices = [o[2] for o in outputs]
        self.templates = [o[3] for o in outputs]
        self.shapes = [tuple(o[4]) if o[4] is not None else None for o in outputs]
        self.itemsizes = [t.element_size() for t in self.templates]
        self.scratch_ptr = scratch_ptr
        self.recycle = recycle
        self.recycle_max_bytes = recycle_max_bytes
        self.c_raw = <Py_ssize_t*>calloc(self.n + 1, sizeof(Py_ssize_t))
        self.c_names = <const char**>calloc(self.n + 1, sizeof(char*))
        if self.c_raw == NULL or self.c_names == NULL:
            raise MemoryError()
        self.c_name_bytes = [n.encode() for n in self.names]
        for k in range(self.n):
            self.c_names[k] = <const char*>self.c_name_bytes[k]
            if _raw_data and self.shapes[k] is not None and math.prod(self.shapes[k]) > 0:
                self.c_raw[k] = self.itemsizes[k]

    def __dealloc__(self):
        free(self.c_raw)
        free(self.c_names)

    cdef list bind(self, _Binding b, tuple shapes):
        """New (or recycled) output tensors, bound. shapes: per output, from the size
        function (None for a static graph); an output whose shape is None there is left
        to ORT to allocate (see take_ort_allocated)."""
        cdef Py_ssize_t i
        cdef bint static
        cdef list outs = []
        cdef uintptr_t ptr
        for i in range(self.n):
            if self.any_inplace and <Py_ssize_t>self.inplace_arg[i] >= 0:
                outs.append(None)  # (bind_inplace)
                continue
            shape = self.shapes[i]
            static = shape is not None
            if not static:
                shape = shapes[i]
                if shape is None:
                    if b.iob is None:
                        b.set_output(i, 0, None, 0, 0)
                    else:
                        b.iob.bind_output(self.names[i], self.ort_devices[i])
                    outs.append(None)
                    continue
            if self.recycle:
                last = b.outputs[i]
                if (last is not None
                        and (static or (last.shape == shape and last.nbytes <= self.recycle_max_bytes))
                        and _unobservable(last, b.bound_out_ptrs[i], self.c_raw[i] if static else 0)):
                    outs.append(last)
                    continue
            out = empty_like(self.templates[i]) if static else self.templates[i].new_empty(shape)
            ptr = _address(out, self.c_raw[i] if static else 0, self.scratch_ptr)
            if b.iob is None:
                b.set_output(i, ptr, shape, self.elem_types[i], self.itemsizes[i])
            else:
                b.iob.bind_output(self.names[i], self.ort_devices[i], self.elem_types[i], shape, ptr)
            if self.recycle:
                b.outputs[i] = out
                b.bound_out_ptrs[i] = ptr
            outs.append(out)
        return outs

    cdef bind_inplace(self, _Binding b, tuple args, _Inputs inputs, list outs):
        """Outputs ORT writes into an argument's memory (Runner's inplace): each is bound to
        the memory its argument is bound from, and is that argument. Where that memory is a
        contiguous copy (the argument is not contiguous), a copy of its own is bound as both
        the argument and the output, and the output is that copy."""
        cdef Py_ssize_t i, j
        cdef uintptr_t ptr
        for i in range(self.n):
            j = self.inplace_arg[i]
            if j < 0:
                continue
            a = args[j]
            ptr = b.bound_ptrs[j]
            if <uintptr_t>_data_ptr_of(a) != ptr:
                a = _materialized(a)
                ptr = _address(a, 0, self.scratch_ptr)
                inputs._bind_input(b, j, a.shape, ptr)
            shape = self.shapes[i]
            if shape is None:  # symbolic: the argument's (the output has its shape)
                shape = a.shape
                b.bound_out_ptrs[i] = 0  # (its shape may change with the same memory: bound anew)
            if ptr != b.bound_out_ptrs[i]:
                if b.iob is None:
                    b.set_output(i, ptr, shape, self.elem_types[i], self.itemsizes[i])
                else:
                    b.iob.bind_output(self.names[i], self.ort_devices[i], self.elem_types[i], shape, ptr)
                if self.shapes[i] is not None:
                    b.bound_out_ptrs[i] = ptr
            outs[i] = a

    cdef take_ort_allocated(self, _Binding b, list outs):
        """Outputs ORT allocated (None in outs) become torch tensors through DLPack. (No
        `None in outs`: that compares tensors with None through torch's __eq__, ~13 µs.)"""
        global _live_values
        cdef Py_ssize_t i
        if b.iob is None:  # the C API: copies, then ORT's values released, even if one copy fails
            made = [i for i in range(len(outs)) if outs[i] is None]
            _live_values += len(made)  # made by Run
            try:
                for i in made:
                    outs[i] = _tensor_of(b.out_values[i], self.templates[i], self.elem_types[i])
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


cdef class _FrozenWeights:
    """The arguments that are initializers of the session, as the session was built from them."""

    def __init__(self, list indices, list tensors, list contents, on_death):
        """contents: per tensor, the bytes to compare its memory with per call (CPU buffers),
        or None. on_death(ref): called when one of the tensors is freed."""
        cdef Py_ssize_t k, n = len(tensors)
        self.refs = [weakref.ref(t, on_death) for t in tensors]
        self.ptrs = <uintptr_t*>calloc(n + 1, sizeof(uintptr_t))
        self.versions = <int64_t*>calloc(n + 1, sizeof(int64_t))
        self.itemsizes = <Py_ssize_t*>calloc(n + 1, sizeof(Py_ssize_t))
        if self.ptrs == NULL or self.versions == NULL or self.itemsizes == NULL:
            raise MemoryError()
        for k in range(n):
            self.itemsizes[k] = tensors[k].element_size()
            self.ptrs[k] = _frozen_ptr(tensors[k], self.itemsizes[k]) if _raw_versions else tensors[k].data_ptr()
            self.versions[k] = tensors[k]._version
        self.contents = contents if contents is not None else [None] * n
        self.indices = list(indices)

    def __dealloc__(self):
        free(self.ptrs)
        free(self.versions)
        free(self.itemsizes)

    cdef bint changed(self, tuple args):
        """Whether a frozen argument is not what the session was built from: another tensor
        object, other memory (`.data =`), written in place since (version counter), or, for
        a buffer, other contents (BatchNorm's kernels write running statistics in place
        without bumping the version counter)."""
        cdef Py_ssize_t k
        cdef uintptr_t ptr
        cdef int64_t version
        cdef bytes contents
        for k in range(len(self.indices)):
            a = args[<Py_ssize_t>self.indices[k]]
            if PyWeakref_GetObject(self.refs[k]) is not <PyObject*>a:
                return True
            if _raw_versions:  # read from the tensor's TensorImpl (-1: no counter)
                version = _raw_version(_impl_of(a))
                ptr = _frozen_ptr(a, self.itemsizes[k])
            else:
                try:
                    version = _version_of(a)
                except RuntimeError:  # an inference tensor now (e.g. `.data =` one): no counter
                    return True
                ptr = _data_ptr_of(a)
            if version != self.versions[k] or ptr != self.ptrs[k]:
                return True
            contents = self.contents[k]
            if contents is not None and memcmp(<const void*>ptr, <const char*>contents, len(contents)) != 0:
                return True
        return False

    def tensors(self):
        return {i: r() for i, r in zip(self.indices, self.refs)}


cdef class Runner:
    """Runs one graph's session on a call's arguments (see __init__)."""

    def __init__(self, str name, sess, run_options, binding_factory, inputs, outputs, plan, scratch,
                 guard_factory=None, bint returns_tuple=True, bint boxed=False, bint recycle_outputs=False,
                 sizes_fn=None, Py_ssize_t recycle_max_bytes=0, stream_of=None, session_for=None, failures=(),
                 pattern_key=None, size_constants=None, inplace=()):
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
        failures: (ORT output index, message, error) per 0-d bool CPU output that, when
            true after a run, makes the call raise error(message) (aten's runtime errors),
            or, error None, fail the run as ORT failing at the node the message names.
        pattern_key: (name, OrtDevice) of a (N, 0) uint8 CPU input the graph has for ORT's
            memory-pattern cache key: per call, N makes that key a hash of the argument sizes
            (see _Inputs.bind_pattern_key).
        size_constants: (callable, n): the last n inputs are not passed by the caller but
            computed from the call's arguments by callable(args) -> tuple of n tensors
            (ortlite.runner.SizeConstants: int arguments, shapes and frozen weights determine
            them). An ONNX Runtime failure there is a failed run (on_run_failure).
        inplace: (ORT output index, argument index) per output that ORT writes into that
            argument's memory (a static tensor of the output's shape and dtype; the kernel
            makes it from the argument in place: GroupQueryAttention's present key sharing
            the past key's buffer). The call returns the argument itself as that output.
        on_run_failure (attribute): when ORT fails a run, called with the RunError; what it
            returns takes (*args) and runs the graph from then on, this call included.
            None: the RunError is raised."""
        n_constants = 0
        if size_constants is not None:
            self.size_constants, n_constants = size_constants
        self.name = name
        self.inputs = _Inputs(name, inputs, scratch.data_ptr(), guard_factory, pattern_key, n_constants)
        self.outputs = _Outputs(outputs, scratch.data_ptr(), recycle_outputs, recycle_max_bytes, inplace)
        self.sess = sess
        self.run_options = run_options
        if _api != NULL:
            self.c_run_options = CRunOptions()
        self.binding_factory = binding_factory
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
        self.sizes_fn = sizes_fn
        self.failure_outputs = [f[0] for f in failures]
        self.failure_messages = [f[1] for f in failures]
        self.failure_errors = [f[2] for f in failures]
        self.scratch = scratch
        if recycle_outputs:  # two bindings used in turn: the caller usually still holds the last result
            self.pool.extend([self._new_binding(), self._new_binding()])

    cdef _Binding _new_binding(self):
        return self.inputs.new_binding(self.sess, self.pool, self.outputs.n, self.binding_factory)

    def __call__(self, *args):
        cdef Py_ssize_t n
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
        if n != self.inputs.n_given:
            raise TypeError(f"ortlite graph {self.name}: expected {self.inputs.n_given} arguments, got {n}")
        if self.frozen is not None and self.frozen.changed(args):
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
            keep_alive = self.inputs.bind(b, args)
            if constants is not None:
                self.inputs.bind_constants(b, constants)
            if self.inputs.pattern_key is not None:
                self.inputs.bind_pattern_key(b)
            if self.sizes_fn is not None:
                shapes, sizes = self.sizes_fn(args)
            else:
                shapes = sizes = None
            outs = self.outputs.bind(b, shapes)
            if self.outputs.any_inplace:
                self.outputs.bind_inplace(b, args, self.inputs, outs)
            error = None
            if not self.outputs.n:  # a graph of size arithmetic alone has nothing for ORT to run
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
                    self.outputs.take_ort_allocated(b, outs)
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
            status = _run(sess, run_options, self.inputs.c_names, <const OrtValue* const*>b.in_values, b.n_in,
                          self.outputs.c_names, b.n_out, b.out_values)
        if status == NULL:
            return None
        try:
            _check(status)
        except OrtError as e:
            return e

    cdef _raise_failures(self, list outs):
        """Raises aten's runtime error of a true condition; returns a RunError for a true
        to-torch condition (the results are not aten's: torch computes them), else None."""
        cdef Py_ssize_t k
        cdef uintptr_t p
        for k in range(len(self.failure_outputs)):
            p = outs[<Py_ssize_t>self.failure_outputs[k]].data_ptr()
            if (<char*>p)[0] and self.failure_errors[k] is None:
                return RunError(f"ortlite: graph {self.name} cannot give aten's result for these inputs, {self.failure_messages[k]}")
        for k in range(len(self.failure_outputs)):
            p = outs[<Py_ssize_t>self.failure_outputs[k]].data_ptr()
            if (<char*>p)[0]:
                raise self.failure_errors[k](self.failure_messages[k])
        return None

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

    # ---- frozen weights, sessions and streams ----

    def weights_changed(self, *args):
        """The per-call staleness check alone, on a call's arguments (bench/frozen.py times it)."""
        return self.frozen is not None and self.frozen.changed(args)

    def set_frozen(self, list indices, list tensors, sess=None, list contents=None):
        """Watch these arguments (now holding `tensors`) for changes; with sess, run that
        session (built from them) from now on. contents: per tensor, the bytes to compare
        its memory with per call (CPU buffers), or None."""
        self.frozen = _FrozenWeights(indices, tensors, contents, self._weight_died)
        if sess is not None:
            self._use_session(sess)

    def frozen_tensors(self):
        """Argument index -> the frozen tensor (None if it died), in index order."""
        return self.frozen.tensors() if self.frozen is not None else {}

    def replace(self, replacement):
        """Calls go to `replacement` from now on (the graph with its weights bound, or without
        its size prelude); this runner's sessions are released."""
        self.replacement = replacement
        self.frozen = None
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
        if self.outputs.recycle:
            self.pool.extend([self._new_binding(), self._new_binding()])

    cdef _use_stream(self, key):
        self.by_stream[self.stream_key] = (self.sess, self.pool)
        entry = self.by_stream.get(key)
        if entry is None:
            entry = (self.session_for(key), [])
        self.sess, self.pool = entry
        self.stream_key = key

    # ---- introspection ----

    @property
    def plain_tensors(self):
        """Whether tensor subclasses with a __torch_function__ of their own are refused
        (ortlite.compile: no Dynamo to run it)."""
        return self.inputs.plain_tensors

    @plain_tensors.setter
    def plain_tensors(self, bint value):
        self.inputs.plain_tensors = value

    @property
    def raw_guarded(self):
        """Whether the guarded path checks arguments from their TensorImpls (not TensorGuards)."""
        return self.inputs.raw_checks != NULL

    def fed_pattern_key(self):
        """The first dim of the memory-pattern key input at the last call (None: the graph has none)."""
        if self.inputs.pattern_key is None or not self.pool:
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
        return self.inputs.describe()
