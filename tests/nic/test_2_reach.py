"""What the tenants' functions reach through the agent's rules: their own
listener (end to end), and nothing else."""

import os

import lab
import netns


def test_a_puts_and_gets_byte_exact_through_its_function(stack):
    obj = stack.work / "obj"
    obj.write_bytes(os.urandom(3_000_000))
    put = stack.cli("sla", "shima", "put", obj, "data/lane/obj")
    assert put.returncode == 0, put.stderr
    get = stack.cli("sla", "shima", "get", "data/lane/obj", stack.work / "obj.back")
    assert get.returncode == 0, get.stderr
    assert (stack.work / "obj.back").read_bytes() == obj.read_bytes()


def test_bs_shim_is_served_on_bs_listener(stack):
    r = stack.cli("slb", "shimb", "whoami")
    assert r.returncode == 0 and "beta" in r.stdout, r.stdout + r.stderr


def test_no_function_reaches_storage_another_tenant_or_the_agents_other_ports(stack):
    for ns, host, port, what in [
        ("sla", lab.ST, 9000, "A reached the storage endpoint"),
        ("slb", lab.ST, 9000, "B reached the storage endpoint"),
        ("slb", lab.AG, 7101, "B reached A's listener"),
        ("slb", lab.AG, 9100, "B reached the agent's metrics"),
        ("slb", lab.A, 22, "B reached A"),
        ("sla", lab.AG, 7102, "A reached B's listener"),
    ]:
        assert not netns.connects(ns, host, port), what


def test_as_secret_on_bs_function_is_refused_and_counted(stack):
    before = stack.metric("sluice_agent_auth_failures_total", 'reason="listener"')
    r = stack.cli("slb", "shimx", "whoami")
    assert r.returncode != 0, f"a shim with A's secret on B's function was served: {r.stdout}"
    assert 'this listener serves tenant "beta" only' in r.stdout + r.stderr, r.stderr
    assert stack.metric("sluice_agent_auth_failures_total", 'reason="listener"') > before


def test_object_bytes_cross_the_storage_link_encrypted(stack, sniffers):
    """The agent reaches storage over HTTPS (a private CA): the frames on
    the storage port carry the object, but no run of its bytes in clear."""
    obj = os.urandom(2_000_000)
    path = stack.work / "wire-obj"
    path.write_bytes(obj)
    sniffers["storage"].clear()
    assert stack.cli("sla", "shima", "put", path, "data/lane/wire").returncode == 0
    netns.settle()
    seen = sniffers["storage"].bytes
    assert seen > len(obj), f"only {seen} bytes crossed the storage port for a {len(obj)}-byte object"
    samples = [obj[i:i + 32] for i in range(0, len(obj), 100_003)]
    leaked = [s for s in samples if sniffers["storage"].matching(lambda f, s=s: s in f)]
    assert leaked == [], f"{len(leaked)} of {len(samples)} samples of the object crossed the wire in clear"
