"""Fixtures of the NIC isolation lane (see lab.py for the topology).

`bridge`: Open vSwitch, the four namespaces and the storage gateway, no
agent. `stack`: the agent programming the bridge and the tenants' shims.
Both live for the whole run; the tests run in file order, each leaving the
stack as it found it unless its name says otherwise.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import lab as lablib  # noqa: E402
import netns  # noqa: E402

_LAB = None


@pytest.fixture(scope="session")
def bridge():
    global _LAB
    if os.geteuid() != 0:
        pytest.fail("the NIC lane needs root (network namespaces, Open vSwitch)")
    for b in ("sluice-gateway", "sluice-agent", "sluice-shim", "sluice"):
        if not (lablib.BIN / b).exists():
            pytest.fail(f"{lablib.BIN / b} is missing (cargo build --workspace --bins)")
    _LAB = lablib.Lab()
    try:
        _LAB.write_secrets_and_certs()
        _LAB.start_gateway()
        yield _LAB
    finally:
        _LAB.teardown(keep=os.environ.get("SLUICE_NIC_KEEP") == "1")


@pytest.fixture(scope="session")
def stack(bridge):
    bridge.start_agent()
    bridge.start_shims()
    return bridge


@pytest.fixture
def sniffers(bridge):
    """A promiscuous sniffer on every host's eth0: what the switch delivers."""
    s = {host: netns.Sniffer(ns) for host, (ns, *_) in lablib.HOSTS.items()}
    yield s
    for x in s.values():
        x.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and _LAB is not None:
        rep.sections.append(("flow table, meters, daemons", _LAB.diagnostics()))
