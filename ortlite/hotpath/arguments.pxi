# A call's arguments: checked against the graph's input schema (one guard call for all of
# them once they have passed validation) and bound into a _Binding, rewrapping only what
# changed since it was last used. Included by ortlite/_fast.pyx; fields in _fast.pxd.

# The memory-pattern key that every set of sizes after the first MAX_PATTERN_KEYS shares.
DEF SHARED_PATTERN_KEY = 0x2545F4914F6CDD1D


cdef class _Binding:
    """What one caller at a time binds: a pybind IOBinding (iob), or for a CSession the
    OrtValues of inputs and outputs (in_values, out_values; NULL where none); what was last
    bound, and buffers for scalar arguments."""

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


cdef inline uintptr_t _address(object t, Py_ssize_t raw_itemsize, uintptr_t scratch_ptr) except? 0:
    """The address to bind for tensor t: read from torch's objects where raw_itemsize (its
    element size: a dense tensor with elements, _raw_data), else its data_ptr(); the scratch
    buffer's for an empty tensor (whose data_ptr() is 0)."""
    cdef uintptr_t ptr
    if raw_itemsize:
        return _raw_data_ptr(t, raw_itemsize)
    ptr = _data_ptr_of(t)
    return ptr if ptr != 0 else scratch_ptr


cdef class _Inputs:
    """The graph's arguments: what each must be, and how a call's are checked and bound."""

    def __init__(self, str graph, inputs, uintptr_t scratch_ptr, guard_factory, pattern_key, Py_ssize_t n_constants):
        """inputs: (kind, name, dtype, elem_type, ort_device, device_index, shape) per argument,
        the last n_constants computed by the runner (size constants), not passed.
        guard_factory, pattern_key: see Runner."""
        cdef Py_ssize_t k
        self.graph = graph
        self.n_args = len(inputs)
        self.n_given = self.n_args - n_constants
        self.kinds = [i[0] for i in inputs]
        self.names = [i[1] for i in inputs]
        self.dtypes = [i[2] for i in inputs]
        self.elem_types = [i[3] for i in inputs]
        self.ort_devices = [i[4] for i in inputs]
        self.device_index = [i[5] for i in inputs]
        self.shapes = [tuple(i[6]) if i[6] is not None else None for i in inputs]
        self.static = [i[6] is not None and -1 not in i[6] for i in inputs]
        self.itemsizes = [d.itemsize if d is not None else 0 for d in self.dtypes]
        self.c_kinds = <int*>calloc(self.n_args + 1, sizeof(int))
        self.c_static = <char*>calloc(self.n_args + 1, sizeof(char))
        self.c_raw = <Py_ssize_t*>calloc(self.n_args + 1, sizeof(Py_ssize_t))
        if self.c_kinds == NULL or self.c_static == NULL or self.c_raw == NULL:
            raise MemoryError()
        for k in range(self.n_args):
            self.c_kinds[k] = self.kinds[k]
            self.c_static[k] = self.static[k]
            if _raw_data and self.kinds[k] == K_TENSOR and self.static[k] and math.prod(self.shapes[k]) > 0:
                self.c_raw[k] = self.dtypes[k].itemsize
        self.scratch_ptr = scratch_ptr
        self.guard_factory = guard_factory
        self.tensor_indices = [i for i in range(self.n_given) if self.kinds[i] == K_TENSOR]
        self.all_tensors = len(self.tensor_indices) == self.n_given
        self._key_inputs(pattern_key)
        self._feed_names()

    def __dealloc__(self):
        free(self.raw_checks)
        free(self.c_kinds)
        free(self.c_static)
        free(self.c_raw)
        free(self.feed_pos)
        free(self.c_names)
        free(self.varying)

    cdef _key_inputs(self, pattern_key):
        cdef Py_ssize_t i, k = 0
        if pattern_key is None:
            return
        self.pattern_key, self.key_device = pattern_key
        self.varying = <Py_ssize_t*>calloc(self.n_args + 1, sizeof(Py_ssize_t))
        if self.varying == NULL:
            raise MemoryError()
        for i in range(self.n_args):
            if self.kinds[i] == K_INT or (self.kinds[i] == K_TENSOR and not self.static[i]):
                self.varying[k] = i
                k += 1
            elif self.kinds[i] == K_TENSOR:
                for d in self.shapes[i]:
                    self.static_dims_xor ^= <uint64_t>d
        self.n_varying = k

    cdef _feed_names(self):
        """The names ORT is fed under (C API), in feed order: the arguments that are neither
        unused nor frozen, then the pattern key."""
        cdef Py_ssize_t i, k = 0
        self.feed_pos = <Py_ssize_t*>calloc(self.n_args + 1, sizeof(Py_ssize_t))
        self.c_names = <const char**>calloc(self.n_args + 2, sizeof(char*))
        if self.feed_pos == NULL or self.c_names == NULL:
            raise MemoryError()
        self.c_name_bytes = [name.encode() if name is not None else None for name in self.names]
        for i in range(self.n_args):
            if self.c_name_bytes[i] is None or self.kinds[i] == K_UNUSED or self.kinds[i] == K_FROZEN:
                self.feed_pos[i] = -1
            else:
                self.feed_pos[i] = k
                self.c_names[k] = <const char*>self.c_name_bytes[i]
                k += 1
        self.n_fed = k
        if self.pattern_key is not None:
            self.c_name_bytes.append(self.pattern_key.encode())
            self.c_names[k] = <const char*>self.c_name_bytes[len(self.c_name_bytes) - 1]

    cdef _Binding new_binding(self, sess, list pool, Py_ssize_t n_out, binding_factory):
        """A binding for sess (returned to pool after each call) with its scalar arguments'
        buffers bound once."""
        cdef _Binding b = _Binding()
        cdef Py_ssize_t i
        cdef bint c = type(sess) is CSession
        b.sess = sess
        b.pool = pool
        b.bound_ptrs = <uintptr_t*>calloc(self.n_args + 1, sizeof(uintptr_t))
        b.bound_out_ptrs = <uintptr_t*>calloc(n_out + 1, sizeof(uintptr_t))
        if b.bound_ptrs == NULL or b.bound_out_ptrs == NULL:
            raise MemoryError()
        b.bound_shapes = [None] * self.n_args
        b.scalar_buffers = [None] * self.n_args
        b.scalar_ptrs = [0] * self.n_args
        b.outputs = [None] * n_out
        b.bound_key = -1
        if c:
            b.n_in, b.n_out = self.n_fed + (self.pattern_key is not None), n_out
            b.in_values = <OrtValue**>calloc(b.n_in + 1, sizeof(OrtValue*))
            b.out_values = <OrtValue**>calloc(b.n_out + 1, sizeof(OrtValue*))
            b.scalars = <int64_t*>calloc(self.n_args + 1, sizeof(int64_t))
            if b.in_values == NULL or b.out_values == NULL or b.scalars == NULL:
                raise MemoryError()
        else:
            b.iob = binding_factory(sess)
        for i in range(self.n_args):
            kind = self.kinds[i]
            if kind == K_INT or kind == K_FLOAT or kind == K_BOOL:
                if c:
                    b.scalar_ptrs[i] = <uintptr_t>&b.scalars[i]
                    b.set_input(self.feed_pos[i], b.scalar_ptrs[i], (), self.elem_types[i], self.itemsizes[i])
                    continue
                buf = torch.zeros((), dtype=self.dtypes[i])
                b.scalar_buffers[i] = buf
                b.scalar_ptrs[i] = buf.data_ptr()
                b.iob.bind_input(self.names[i], self.ort_devices[i], self.elem_types[i], (), buf.data_ptr())
        return b

    cdef list bind(self, _Binding b, tuple args):
        """Checks and binds the call's arguments; returns the contiguous copies made, to be
        kept alive until the run ends (None: none)."""
        if (self.raw_checks != NULL and self._raw_guarded(args)) or (
                self.guard_check is not None and not self._any_nested(args) and self.guard_check(*self._tensor_args(args))):
            return self._bind_guarded(b, args)
        return self._bind_validated(b, args)

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
                ptr = _address(a, self.c_raw[i], self.scratch_ptr)  # raw: the guard checked a plain dense tensor with elements
                if ptr != b.bound_ptrs[i]:
                    self._bind_input(b, i, self.shapes[i], ptr)
            else:
                if not a.is_contiguous():  # dynamic dims: the guard does not check strides
                    return self._bind_validated(b, args)
                shape = a.shape
                ptr = _address(a, 0, self.scratch_ptr)
                if ptr != b.bound_ptrs[i] or shape != b.bound_shapes[i]:
                    self._bind_input(b, i, shape, ptr)
        return None

    cdef list _bind_validated(self, _Binding b, tuple args):
        """Check each argument against the schema, make it contiguous, bind it."""
        cdef Py_ssize_t i
        cdef int kind
        cdef uintptr_t ptr
        keep_alive = []
        for i in range(self.n_given):
            kind = self.kinds[i]
            a = args[i]
            if kind == K_TENSOR:
                if not isinstance(a, Tensor) or _nested(a) or a.dtype is not self.dtypes[i] or not self._device_ok(i, a):
                    self._mismatch(i, a)
                shape = a.shape
                if self.static[i]:
                    if shape != self.shapes[i]:
                        self._mismatch(i, a)
                elif not self._dims_ok(i, shape):
                    self._mismatch(i, a)
                if a.layout is not _strided or (self.plain_tensors and _overrides_torch_function(a)):
                    self._mismatch(i, a)
                if not a.is_contiguous() or _lazy(a):
                    a = _materialized(a)
                    keep_alive.append(a)
                ptr = _address(a, 0, self.scratch_ptr)
                if ptr != b.bound_ptrs[i] or shape != b.bound_shapes[i]:
                    self._bind_input(b, i, shape, ptr)
            else:
                self._write_scalar(b, i, kind, a)
        if not self.raw_tried and not keep_alive:
            self._build_raw_checks(args)
        if self.guard_check is None and self.guard_factory is not None and not keep_alive:
            # Tensors like these pass the guard from now on: one C++ check for all.
            guard = self.guard_factory(self._tensor_args(args))
            self.guard_check = guard.check if guard is not None else None
            self.guard_factory = None
        return keep_alive

    cdef inline _bind_input(self, _Binding b, Py_ssize_t i, shape, uintptr_t ptr):
        if b.iob is None:
            b.set_input(self.feed_pos[i], ptr, shape, self.elem_types[i], self.itemsizes[i])
        else:
            b.iob.bind_input(self.names[i], self.ort_devices[i], self.elem_types[i], shape, ptr)
        b.bound_ptrs[i] = ptr
        b.bound_shapes[i] = shape

    cdef inline _write_scalar(self, _Binding b, Py_ssize_t i, int kind, a):
        """Python numbers go into 0-d buffers bound once; UNUSED arguments are ignored."""
        cdef uintptr_t p = b.scalar_ptrs[i]
        if kind == K_INT:
            (<int64_t*>p)[0] = a
        elif kind == K_FLOAT:
            (<double*>p)[0] = a
        elif kind == K_BOOL:
            (<char*>p)[0] = 1 if a else 0

    cdef bind_constants(self, _Binding b, tuple constants):
        """The size constants' tensors, bound after the arguments: made by SizeConstants
        (contiguous, of the dtypes the prelude gives the model), not checked. The same tuple
        comes back while sizes repeat, and a binding that bound it skips this."""
        cdef Py_ssize_t k, i
        cdef uintptr_t ptr
        if constants is b.bound_constants:
            return
        for k in range(len(constants)):
            i = self.n_given + k
            t = constants[k]
            shape = t.shape
            ptr = _address(t, 0, self.scratch_ptr)
            if ptr != b.bound_ptrs[i] or shape != b.bound_shapes[i]:
                self._bind_input(b, i, shape, ptr)
        b.bound_constants = constants

    cdef int bind_pattern_key(self, _Binding b) except -1:
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
                not self.c_static[i] or self.device_index[i] != -1 or len(self.shapes[i]) > MAX_RAW_DIMS
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

    cdef bint _any_nested(self, tuple args):
        cdef Py_ssize_t i
        for i in range(self.n_given):
            if self.c_kinds[i] == K_TENSOR and _nested(args[i]):
                return True
        return False

    cdef tuple _tensor_args(self, tuple args):
        if self.all_tensors:
            return args
        return tuple([args[i] for i in self.tensor_indices])

    cdef bint _device_ok(self, Py_ssize_t i, a):
        index = self.device_index[i]
        if index == -1:
            return a.is_cpu
        return a.is_cuda and a.get_device() == index

    cdef bint _dims_ok(self, Py_ssize_t i, shape):
        expected = self.shapes[i]
        if len(shape) != len(expected):
            return False
        for got, want in zip(shape, expected):
            if want != -1 and got != want:
                return False
        return True

    cdef _mismatch(self, Py_ssize_t i, a):
        from ortlite.runner import describe_mismatch
        raise describe_mismatch(self.graph, i, self.names[i], self.dtypes[i], self.device_index[i], self.shapes[i], a)

    def describe(self):
        return [(self.names[i], str(self.dtypes[i]), self.shapes[i]) for i in range(self.n_args) if self.kinds[i] == K_TENSOR]
