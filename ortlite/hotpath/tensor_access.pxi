# Torch's tensors as the hot path reads them: data pointers, version counters, reference
# counts and the guarded path's tensor check, read straight from torch's C++ objects where
# their layouts check out at import (each found, then checked against torch's own
# accessors; where anything disagrees, the accessors are used instead), and the tensor
# kinds whose memory is not their values. Included by ortlite/_fast.pyx.

cdef object _storage_use_count = torch._C._storage_Use_Count


cdef extern from "Python.h":
    ctypedef struct _TypeWithWeaklist "PyTypeObject":
        Py_ssize_t tp_basicsize
        Py_ssize_t tp_weaklistoffset


cdef extern from "<malloc.h>":
    size_t malloc_usable_size(void* ptr) nogil


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


cdef Py_ssize_t _heap_bytes(void* p, Py_ssize_t limit) noexcept:
    """Of limit bytes from p (a C++ object torch allocated), those inside its allocation. The
    probes below scan objects whose sizes they do not know, and the memory past one may be
    unmapped: a thread's malloc arena grows a page at a time, and `import ortlite` in a thread
    (a Ray Serve replica's) crashed reading past a TensorImpl there."""
    return min(limit, <Py_ssize_t>malloc_usable_size(p))


cdef Py_ssize_t _find_word(void* base, uintptr_t value, Py_ssize_t start, Py_ssize_t limit):
    cdef Py_ssize_t off
    for off in range(start, limit - <Py_ssize_t>sizeof(void*) + 1, sizeof(void*)):
        if (<uintptr_t*>((<char*>base) + off))[0] == value:
            return off
    return -1


cdef inline uintptr_t _raw_data_ptr(object t, Py_ssize_t itemsize) noexcept:
    """t.data_ptr() of a dense tensor with elements, read from its TensorImpl and StorageImpl."""
    cdef void* impl = _impl_of(t)
    return ((<uintptr_t*>((<char*>_storage_impl_of(impl)) + _DATA_OFFSET))[0]
            + <uintptr_t>((<int64_t*>((<char*>impl) + _STORAGE_OFFSET_OFFSET))[0] * itemsize))


cdef set _offsets_of(void* base, uintptr_t value, Py_ssize_t limit):
    """The offsets in base's first limit bytes (and its heap allocation) that hold value."""
    cdef Py_ssize_t off
    limit = _heap_bytes(base, limit)
    return {off for off in range(0, limit - <Py_ssize_t>sizeof(void*) + 1, sizeof(void*)) if (<uintptr_t*>((<char*>base) + off))[0] == value}


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
    offsets = {_find_word(<void*><PyObject*>t, <uintptr_t>t._cdata, sizeof(PyObject),
                          min(64, (<_TypeWithWeaklist*>(<PyObject*>t).ob_type).tp_basicsize)) for t in found}
    if len(offsets) != 1 or -1 in offsets:
        return "tensor object layout"
    _IMPL_OFFSET = offsets.pop()
    offsets = {_find_word(_impl_of(t), <uintptr_t>t.untyped_storage()._cdata, sizeof(void*), _heap_bytes(_impl_of(t), 512)) for t in found}
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
# (MAX_RAW_DIMS: see _fast.pxd)
cdef Py_ssize_t _KEYS_OFFSET = -1
cdef Py_ssize_t _DTYPE_OFFSET = -1
cdef Py_ssize_t _DIMS_OFFSET = -1
cdef bint _raw_guard = False

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
    if off + <Py_ssize_t>sizeof(int64_t) * (1 + 2 * MAX_RAW_DIMS) > _heap_bytes(_impl_of(t), 512):
        return False
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
    for off in range(0, min(_heap_bytes(_impl_of(t), 512) for t in samples) - 1, 2):
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

# A nested tensor of the strided layout is a Tensor whose sizes and strides throw: TensorGuards'
# check throws them through C++ that cannot (the process aborts), so the guarded path never
# hands it one, and validation names it.
cdef uint64_t _NESTED_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.NestedTensor).raw_repr()


cdef inline bint _nested(object a):
    """a is a Tensor or Parameter (the types a guard is built from) that is nested."""
    if type(a) is not Tensor and type(a) is not _Parameter:
        return False
    if _raw_guard:
        return ((<uint64_t*>((<char*>_impl_of(a)) + _KEYS_OFFSET))[0] & _NESTED_KEY) != 0
    return a.is_nested


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


def overrides_torch_function(a):
    """Whether a is of a tensor subclass with a __torch_function__ of its own (what
    ortlite.compile refuses: there is no Dynamo to run it)."""
    return _overrides_torch_function(a)


cdef _materialized(a):
    """A contiguous tensor holding a's values (see _lazy)."""
    if a._is_zerotensor():
        return torch.zeros(a.shape, dtype=a.dtype, device=a.device)
    return a.resolve_conj().resolve_neg().contiguous()


