"""The caller networks' commands (latency_bench/chaos/netns.py); the namespaces themselves are made
by tests/reliability/test_caller_network.py."""

from __future__ import annotations

import pytest

from latency_bench.chaos.netns import (LinkProfile, Names, blackhole_commands, clear_shape_commands, setup_commands,
                                       shape_commands, teardown_commands)

NAMES = Names.for_process(4194304, 254)  # the largest pid and subnet


def test_interface_names_fit_linux_limit_and_addresses_share_a_subnet():
    assert len(NAMES.host_link) <= 15 and len(NAMES.caller_link) <= 15
    assert NAMES.host_link != NAMES.caller_link
    assert (NAMES.host_ip, NAMES.caller_ip) == ("10.213.254.1", "10.213.254.2")


def test_the_caller_end_and_its_address_live_in_the_namespace():
    commands = [" ".join(c) for c in setup_commands(NAMES)]
    assert commands[0] == f"ip netns add {NAMES.namespace}"
    assert f"ip link set {NAMES.caller_link} netns {NAMES.namespace}" in commands
    assert f"ip netns exec {NAMES.namespace} ip addr add 10.213.254.2/24 dev {NAMES.caller_link}" in commands
    assert teardown_commands(NAMES) == [["ip", "netns", "del", NAMES.namespace]]


def test_loss_drops_at_random_both_ways_inside_the_namespace_and_the_rate_shapes_both_ends():
    commands = shape_commands(NAMES, LinkProfile(loss=0.05, rate_kbit=256))
    drops = [c for c in commands if "statistic" in c]
    assert {c[c.index("-A") + 1] for c in drops} == {"INPUT", "OUTPUT"}
    assert all(c[:4] == ["ip", "netns", "exec", NAMES.namespace] and "0.0500" in c for c in drops)
    shaped = {c[c.index("dev") + 1] for c in commands if "tbf" in c}
    assert shaped == {NAMES.host_link, NAMES.caller_link}
    assert all("256kbit" in c for c in commands if "tbf" in c)
    assert shape_commands(NAMES, LinkProfile()) == []
    assert all(c[:4] == ["ip", "netns", "exec", NAMES.namespace] or c[:2] == ["tc", "qdisc"]
               for c in clear_shape_commands(NAMES))  # nothing on the host's own tables


def test_a_blackhole_goes_first_in_both_chains_and_comes_off_as_it_went_on():
    on, off = blackhole_commands(NAMES, on=True), blackhole_commands(NAMES, on=False)
    assert [c[c.index("-I") + 1:c.index("-I") + 3] for c in on] == [["INPUT", "1"], ["OUTPUT", "1"]]
    # -D CHAIN RULE removes exactly the rule that -I CHAIN 1 RULE put in
    assert [c[c.index("-D") + 1:] for c in off] == [[c[c.index("-I") + 1], *c[c.index("-I") + 3:]] for c in on]


@pytest.mark.parametrize("loss, rate", [(-0.1, None), (1.0, None), (0.0, 0)])
def test_impossible_links_are_refused(loss, rate):
    with pytest.raises(ValueError):
        LinkProfile(loss=loss, rate_kbit=rate)
