"""The op table, one module per family; importing registers every lowering."""

from . import creation, elementwise, linalg, nn, reduction, shape, symbolic  # noqa: F401
