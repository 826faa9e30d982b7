"""The library installs no signal handler unless ``iris-fw launch`` asks: the watchdog's SIGTERM
handler exists only with ``launcher_signals`` (``IRIS_FW_LAUNCHER_SIGNALS``, which the launcher
sets for its ranks), and the bootstrap contract's liveness interface is what the watchdog uses."""

import signal

import pytest

from iris_fw import launch, watchdog
from iris_fw.bootstraps.single import SingleBootstrap


@pytest.mark.parametrize("asked,installed", [(False, False), (True, True), (None, False)])
def test_sigterm_handler_only_when_asked(monkeypatch, asked, installed):
    monkeypatch.delenv("IRIS_FW_LAUNCHER_SIGNALS", raising=False)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    boot = SingleBootstrap()
    wd = watchdog.Watchdog(boot, 10.0, launcher_signals=asked)
    try:
        assert (signal.getsignal(signal.SIGTERM) == wd._terminated) is installed
        assert boot.liveness is wd  # attached through Bootstrap.attach_liveness
    finally:
        wd.stop()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_the_launcher_asks_for_its_ranks():
    env = launch.rank_environ(0, 2, 29500, "iris_fw_test_", base={})
    assert env["IRIS_FW_LAUNCHER_SIGNALS"] == "1"


def test_the_environment_variable_asks(monkeypatch):
    monkeypatch.setenv("IRIS_FW_LAUNCHER_SIGNALS", "1")
    wd = watchdog.Watchdog(SingleBootstrap(), 10.0)
    try:
        assert signal.getsignal(signal.SIGTERM) == wd._terminated
    finally:
        wd.stop()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
