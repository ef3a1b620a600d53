"""Complex arithmetic as real arithmetic, by decomposition: rotary embeddings written with
complex numbers (llama4's and deepseek_v2's `view_as_complex`, `polar`, a complex product,
`view_as_real`) run in ONNX Runtime, which has no complex dtype.

Each decomposition below takes the real pairs of its complex operands (`view_as_real`, a
view: last dim of 2, real and imaginary), computes the result's pairs with real ops, and
returns them as a complex tensor (`view_as_complex`). So after decomposition every complex
value of such a graph is a `view_as_complex` read only by `view_as_real`s: ONNX has those two
as the same real pairs (ops/shape.py, `complex_pairs`), and no complex value crosses into or
out of ONNX Runtime (their checks).

The arithmetic is eager's own: a product is (ac - bd, ad + bc), a real operand or a number
promoted to (x, 0) first, as eager promotes it (so an infinite part gives eager's NaN);
`polar(r, t)` is (r cos t, r sin t). Values as eager computes them, to the rounding of ONNX
Runtime's sin and cos. An op of complex operands not here (a conjugate, an FFT) is not
decomposed: it stays complex, in torch, and so do the values around it.
"""

from __future__ import annotations

import numbers

import torch

aten = torch.ops.aten
COMPLEX = (torch.complex64, torch.complex128)


def _is_complex(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in COMPLEX


def _plain(*xs) -> bool:
    """Complex tensors whose pairs view_as_real gives (no lazy conjugate or negation)."""
    return all(not (_is_complex(x) and (x.is_conj() or x.is_neg())) for x in xs)


def _pairs(x):
    """(real, imaginary) of a complex tensor, a real tensor or a number, as real tensors or numbers."""
    if _is_complex(x):
        pairs = torch.view_as_real(x)
        return pairs.select(-1, 0), pairs.select(-1, 1)
    if isinstance(x, numbers.Complex) and not isinstance(x, numbers.Real):
        return x.real, x.imag
    return x, 0.0


def _real_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.complex128 else torch.float32


def _complex(re, im, dtype: torch.dtype):
    real = _real_dtype(dtype)
    re, im = [v.to(real) if isinstance(v, torch.Tensor) else torch.scalar_tensor(v, dtype=real) for v in (re, im)]
    re, im = torch.broadcast_tensors(re, im)
    return _as_complex(torch.stack([re, im], dim=-1))


def _as_complex(pairs):
    """view_as_complex of pairs made in the graph (an empty stack's strides may not be its
    contiguous ones: view_as_complex needs the last stride 1)."""
    if pairs.stride(-1) != 1 or any(n != 1 and s % 2 for n, s in zip(pairs.shape[:-1], pairs.stride()[:-1])):
        pairs = pairs.clone(memory_format=torch.contiguous_format)
    return torch.view_as_complex(pairs)


def _result_dtype(*xs) -> torch.dtype:
    return torch.result_type(*xs) if len(xs) == 2 else xs[0].dtype


def _mul(a, b):
    if not (_is_complex(a) or _is_complex(b)) or not _plain(a, b):
        return NotImplemented
    dtype = _result_dtype(a, b)
    if dtype not in COMPLEX:
        return NotImplemented
    real = _real_dtype(dtype)
    (ar, ai), (br, bi) = [[_as(v, real) for v in _pairs(x)] for x in (a, b)]
    return _complex(ar * br - ai * bi, ar * bi + ai * br, dtype)


def _as(v, dtype):
    return v.to(dtype) if isinstance(v, torch.Tensor) else v


def _add(a, b, *, alpha=1, sign=1):
    if not (_is_complex(a) or _is_complex(b)) or not _plain(a, b) or not isinstance(alpha, numbers.Real):
        return NotImplemented
    dtype = _result_dtype(a, b)
    if dtype not in COMPLEX:
        return NotImplemented
    real = _real_dtype(dtype)
    (ar, ai), (br, bi) = [[_as(v, real) for v in _pairs(x)] for x in (a, b)]
    if alpha != 1:  # eager scales b by alpha, promoted to (alpha, 0): a complex product
        br, bi = br * alpha - bi * 0.0, br * 0.0 + bi * alpha
    if sign > 0:
        return _complex(ar + br, ai + bi, dtype)
    return _complex(ar - br, ai - bi, dtype)


def _sub(a, b, *, alpha=1):
    return _add(a, b, alpha=alpha, sign=-1)


def _polar(magnitude, angle):
    if _is_complex(magnitude) or _is_complex(angle):
        return NotImplemented
    dtype = torch.complex128 if magnitude.dtype == torch.float64 else torch.complex64
    return _complex(magnitude * torch.cos(angle), magnitude * torch.sin(angle), dtype)


def _neg(x):
    if not _is_complex(x) or not _plain(x):
        return NotImplemented
    re, im = _pairs(x)
    return _complex(-re, -im, x.dtype)


def _complex_of(re, im):
    return _complex(re, im, torch.complex128 if re.dtype == torch.float64 else torch.complex64)


def _pair_dim(dim: int) -> int:
    """A dim of a complex tensor, as a dim of its pairs (which have one more, last)."""
    return dim - 1 if dim < 0 else dim


def _view(op, adjust):
    """A view or copy of a complex tensor taken of its pairs: op(pairs, *adjust(args))."""

    def decomposition(x, *args, **kwargs):
        if not _is_complex(x) or not _plain(x):
            return NotImplemented
        return _as_complex(op(torch.view_as_real(x), *adjust(x, *args), **kwargs))

    return decomposition


def _cat(tensors, dim=0):
    if not any(_is_complex(t) for t in tensors) or not all(_is_complex(t) and _plain(t) for t in tensors):
        return NotImplemented
    if len({t.dtype for t in tensors}) != 1 or any(t.dim() == 1 for t in tensors):  # (eager skips 1-d empty ones)
        return NotImplemented
    return _as_complex(aten.cat.default([torch.view_as_real(t) for t in tensors], _pair_dim(dim)))


def chained(table: dict) -> dict:
    """DECOMPOSITIONS over `table`: an op's entry there still decomposes what these do not
    (real operands: theirs return NotImplemented)."""

    def chain(mine, previous):
        def decomposition(*args, **kwargs):
            result = mine(*args, **kwargs)
            return previous(*args, **kwargs) if result is NotImplemented else result

        return decomposition

    return {op: chain(fn, table[op]) if op in table else fn for op, fn in DECOMPOSITIONS.items()}


def _assert_metadata(x, *args, **kwargs):
    """torch.export's check of a value's metadata (after a `.to()`): true by construction of
    the lowered graph, as ortlite lowers it for other values; dropped for a complex one,
    which is read then by view_as_real alone."""
    return None if _is_complex(x) else NotImplemented


DECOMPOSITIONS = {
    aten._assert_tensor_metadata.default: _assert_metadata,
    aten.mul.Tensor: _mul,
    aten.add.Tensor: _add,
    aten.sub.Tensor: _sub,
    aten.polar.default: _polar,
    aten.complex.default: _complex_of,
    aten.neg.default: _neg,
    aten.unsqueeze.default: _view(aten.unsqueeze.default, lambda x, dim: (_pair_dim(dim) if dim < 0 else dim,)),
    aten.squeeze.dim: _view(aten.squeeze.dim, lambda x, dim: (_pair_dim(dim),)),
    aten.squeeze.dims: _view(aten.squeeze.dims, lambda x, dims: ([_pair_dim(d) for d in dims],)),
    aten.slice.Tensor: _view(aten.slice.Tensor, lambda x, dim=0, *rest: (_pair_dim(dim), *rest)),
    aten.select.int: _view(aten.select.int, lambda x, dim, index: (_pair_dim(dim), index)),
    aten.view.default: _view(aten.view.default, lambda x, size: ([*size, 2],)),
    aten._unsafe_view.default: _view(aten._unsafe_view.default, lambda x, size: ([*size, 2],)),
    aten.expand.default: _view(aten.expand.default, lambda x, size, *rest: ([*size, 2], *rest)),
    aten.permute.default: _view(aten.permute.default, lambda x, dims: ([d % x.dim() for d in dims] + [x.dim()],)),
    aten.clone.default: _view(aten.clone.default, lambda x: ()),
    aten.alias.default: _view(aten.alias.default, lambda x: ()),
    aten.cat.default: _cat,
}
