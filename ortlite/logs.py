"""The "ortlite" logger, and warnings given once per cause rather than once per call."""

from __future__ import annotations

import logging

log = logging.getLogger("ortlite")
_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)
