"""Leak checks shared by tests that open sockets: ResourceWarnings collected during a
test (an unclosed socket or transport) fail it, since one collected later would fail
another module's check instead."""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def no_resource_warnings() -> Iterator[None]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        yield
        gc.collect()
    leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaks, leaks
