"""The op table, one module per family; importing registers every lowering."""

from . import creation, elementwise, index, linalg, nn, pooling, reduction, shape, sort, special  # noqa: F401
