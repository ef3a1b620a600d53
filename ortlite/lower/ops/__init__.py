"""The op table, one module per family; importing registers every lowering."""

from . import attention, creation, elementwise, experts, index, linalg, nn, polynomial, pooling, random, reduction, shape, sort, special, symbolic  # noqa: F401
