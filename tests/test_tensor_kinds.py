"""Every kind of tensor torch can hand a compiled model, against eager, on all paths:
torch.compile (default and dynamic=True), ortlite.compile, and a model ortlite.load read.

A kind is eager's answer (values, dtype, shape) or eager's error, never a third thing. Each is
called after a plain tensor of the same shape (the runner has built its guard from that one:
the odd tensor must not pass it) and before another (the guard still holds)."""

import pytest
import torch

import ortlite


def _neg_view(shape):  # the negative bit on a contiguous tensor: memory holds the base's values
    return torch._neg_view(torch.randn(shape))


def _conj_real(shape):
    return torch.randn(shape, dtype=torch.cfloat).conj().real


class Passthrough(torch.Tensor):
    pass


class Shifted(torch.Tensor):
    """A subclass whose __torch_function__ changes what mul computes."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        result = super().__torch_function__(func, types, args, kwargs or {})
        if func is torch.Tensor.mul:
            with torch._C.DisableTorchFunctionSubclass():
                result = result + 100
        return result


KINDS = {
    "plain": lambda s: torch.randn(s),
    "transposed": lambda s: torch.randn(s[::-1]).t(),
    "expanded": lambda s: torch.randn(s[0], 1).expand(s),
    "offset": lambda s: torch.randn(s[0] * s[1] + 3)[3:].view(s),
    "neg_bit": _neg_view,
    "imag_of_conj": lambda s: torch.randn(s, dtype=torch.cfloat).conj().imag,  # (strided, with the bit)
    "conj_real": _conj_real,
    "zero_tensor": lambda s: torch._efficientzerotensor(s),
    "requires_grad": lambda s: torch.randn(s, requires_grad=True),
    "parameter": lambda s: torch.nn.Parameter(torch.randn(s)),
    "passthrough_subclass": lambda s: torch.randn(s).as_subclass(Passthrough),
    "torch_function_subclass": lambda s: torch.randn(s).as_subclass(Shifted),
    "sparse": lambda s: torch.randn(s).to_sparse(),
    "mkldnn": lambda s: torch.randn(s).to_mkldnn(),
}
# eager computes these, and ortlite does not bind them: a TypeError that says so
REFUSED = {
    "aot": {"torch_function_subclass", "sparse", "mkldnn"},
    "load": {"torch_function_subclass", "sparse", "mkldnn"},
    "compile": {"mkldnn"},
    "compile_dynamic": {"mkldnn"},
}


class Affine(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2 + 1)


def _paths(tmp_path, shape):
    example = torch.randn(shape)
    aot = ortlite.compile(Affine(), (example,))
    aot.save(tmp_path / "affine.onnx")
    return {
        "compile": torch.compile(Affine(), backend="ortlite"),
        "compile_dynamic": torch.compile(Affine(), backend="ortlite", dynamic=True),
        "aot": aot,
        "load": ortlite.load(tmp_path / "affine.onnx"),
    }


def _eager(x):
    with torch.no_grad():
        try:
            result = Affine()(x)
        except Exception as e:  # noqa: BLE001 (eager's error is the expected outcome)
            return e
        return result.to_dense() if result.layout != torch.strided else result


@pytest.mark.parametrize("path", ["compile", "compile_dynamic", "aot", "load"])
def test_every_tensor_kind_gives_eagers_answer_or_a_named_error(tmp_path, path):
    torch._dynamo.reset()
    shape = (3, 4)
    model = _paths(tmp_path, shape)[path]
    wrong = []
    for kind, make in KINDS.items():
        x = make(shape)
        expected = _eager(x)
        with torch.no_grad():
            plain = torch.randn(shape)
            assert torch.equal(model(plain), _eager(plain))  # the guard is built from a plain tensor
            try:
                got = model(x)
            except Exception as e:  # noqa: BLE001
                refused = kind in REFUSED[path] and isinstance(e, TypeError) and "ortlite" in str(e)
                if not (refused or isinstance(expected, Exception)):
                    wrong.append(f"{kind}: {type(e).__name__}: {e}"[:300])
                continue
            if isinstance(expected, Exception):
                wrong.append(f"{kind}: ran where eager raises {expected!r}")
            elif kind in REFUSED[path]:
                wrong.append(f"{kind}: ran where ortlite refuses it")
            elif not (got.dtype == expected.dtype and got.shape == expected.shape and torch.equal(got, expected)):
                wrong.append(f"{kind}: {got} where eager gives {expected}")
            plain = torch.randn(shape)
            assert torch.equal(model(plain), _eager(plain))
    assert not wrong, "\n".join(wrong)


def test_empty_and_zero_dim_kinds(tmp_path):
    """Empty tensors (data pointer 0) and 0-d tensors of the odd kinds."""
    for shape in ((0, 4), ()):
        torch._dynamo.reset()
        aot = ortlite.compile(Affine(), (torch.randn(shape),))
        compiled = torch.compile(Affine(), backend="ortlite")
        # (the imaginary part of a conjugate: contiguous, with the negative bit, where it has at most one element)
        for x in (torch.randn(shape), torch._efficientzerotensor(shape), _neg_view(shape), torch.randn(shape, dtype=torch.cfloat).conj().imag):
            with torch.no_grad():
                for model in (aot, compiled):
                    assert torch.equal(model(x), _eager(x))
