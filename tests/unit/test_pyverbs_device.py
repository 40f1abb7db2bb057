"""The pyverbs side of RDMA without a device: which enums module is used, and the
messages a member gets when RDMA cannot work on its host."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest

from kdsync.transport.rdma import RdmaUnavailable, pyverbs_device
from kdsync.transport.rdma.pyverbs_device import PyverbsDevice, _pyverbs

_MODULES = ("device", "pd", "cq", "mr", "qp", "addr", "wr")


@pytest.fixture
def fake_pyverbs(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """A stand-in pyverbs package (this machine has none) with the modules the device
    code imports; tests add the enums module of the rdma-core version they play."""
    package = types.ModuleType("pyverbs")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "pyverbs", package)
    for name in _MODULES:
        module = types.ModuleType(f"pyverbs.{name}")
        setattr(package, name, module)
        monkeypatch.setitem(sys.modules, f"pyverbs.{name}", module)
    yield package


def _add_enums(monkeypatch: pytest.MonkeyPatch, package: types.ModuleType, name: str) -> object:
    enums = types.ModuleType(f"pyverbs.{name}")
    setattr(package, name, enums)
    monkeypatch.setitem(sys.modules, f"pyverbs.{name}", enums)
    return enums


def test_rdma_core_59_and_later_use_libibverbs_enums(
    fake_pyverbs: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    newer = _add_enums(monkeypatch, fake_pyverbs, "libibverbs_enums")
    _add_enums(monkeypatch, fake_pyverbs, "enums")
    assert _pyverbs()[1] is newer


def test_earlier_rdma_core_uses_the_enums_module(
    fake_pyverbs: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyverbs.libibverbs_enums", None)  # import fails
    older = _add_enums(monkeypatch, fake_pyverbs, "enums")
    assert _pyverbs()[1] is older


def test_without_pyverbs_the_message_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pyverbs", None)
    monkeypatch.setitem(sys.modules, "pyverbs.addr", None)
    with pytest.raises(RdmaUnavailable, match=r"python3-pyverbs.*transport.type: tcp"):
        _pyverbs()


def test_no_device_names_the_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyverbs_device, "device_names", lambda: [])
    with pytest.raises(RdmaUnavailable) as error:
        PyverbsDevice(None, 1, None)
    text = str(error.value)
    assert "/sys/class/infiniband" in text and "rdma_rxe" in text and "tcp" in text


def test_a_device_that_is_not_there_is_named_with_those_that_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pyverbs_device, "device_names", lambda: ["mlx5_0", "mlx5_1"])
    with pytest.raises(RdmaUnavailable, match=r"'rxe0' not found.*mlx5_0, mlx5_1"):
        PyverbsDevice("rxe0", 1, None)
    with pytest.raises(RdmaUnavailable, match=r"several RDMA devices.*transport.rdma.device"):
        PyverbsDevice(None, 1, None)
