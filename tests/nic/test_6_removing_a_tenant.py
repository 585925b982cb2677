"""Removing tenant B (config + SIGHUP) removes exactly B's flows."""

import signal

import lab
import netns


def beta_tag(stack):
    out = lab.run(lab.BIN / "sluice-agent", "--config", stack.work / "agent.toml", "--print-nic-rules",
                  env={**stack.ovs.env}, check=False)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        if line.startswith("# tenant beta:"):
            return line.split("cookie=0x51ce", 1)[1][:4]
    raise AssertionError(f"no tenant beta in --print-nic-rules:\n{out.stdout}{out.stderr}")


def test_removing_tenant_b_removes_exactly_its_flows(stack):
    # --print-nic-rules runs here, outside the agent's namespace: the
    # config names the agent's MAC rather than finding it on an interface.
    cfg = stack.work / "agent.toml"
    cfg.write_text(cfg.read_text().replace('[nic]\n', f'[nic]\nagent_mac = "{lab.MAC["agent"]}"\n', 1))
    tag = beta_tag(stack)
    before = set(stack.ovs.owned())
    beta = {c for c in before if c[6:10] == tag}
    assert beta, f"no flows of B's tag {tag}"
    cfg.write_text(stack.agent_config(with_beta=False).replace('[nic]\n', f'[nic]\nagent_mac = "{lab.MAC["agent"]}"\n', 1))
    stack.daemons["agent"].signal(signal.SIGHUP)
    lab.wait_for("B's flows to go", 20, lambda: not (set(stack.ovs.owned()) & beta))
    assert set(stack.ovs.owned()) == before - beta, "something other than B's flows changed"
    assert not netns.connects("slb", lab.AG, lab.PORT["B"]), "B's function reaches the agent after B was removed"


def test_a_reload_that_moves_a_tenants_listener_changes_no_rule(stack):
    """Listeners are bound at start: a reload that gives tenant A another
    listener port is refused, every rule kept (rules for it would send A's
    function to a port another tenant's listener, or none, serves)."""
    before = set(stack.ovs.owned())
    cfg = stack.work / "agent.toml"
    text = cfg.read_text()
    moved = text.replace(f"listener_port = {lab.PORT['A']}", f"listener_port = {lab.PORT['A'] + 1000}", 1)
    assert moved != text
    log = lambda: stack.daemons["agent"].log.read_text(errors="replace")
    reloads = log().count("SIGHUP: reload done")
    cfg.write_text(moved)
    stack.daemons["agent"].signal(signal.SIGHUP)
    lab.wait_for("the reload to end", 20, lambda: log().count("SIGHUP: reload done") > reloads)
    assert "listener_port changed" in log(), log()[-2000:]
    assert set(stack.ovs.owned()) == before, "a rule changed"
    cfg.write_text(text)
