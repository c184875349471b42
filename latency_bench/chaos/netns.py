"""A caller's own network: a Linux network namespace joined to this host by a veth pair, whose
link the bench can make lossy, slow or dead (issue 13, scenarios 10 and 11).

    host (server)  10.213.N.1 <-- veth --> 10.213.N.2  namespace (caller)

Loss is iptables' `statistic` match (a random drop of each packet, both ways, in the
namespace); the rate is a `tbf` qdisc on each end's egress; a blackhole is a DROP of
everything in the namespace. netem is not used: this kernel has none. Everything lives in
the namespace and its veth pair, so deleting the namespace undoes it all; nothing touches
the host's own tables. Needs root, iproute2 and iptables (the Makefile installs iptables).

The command builders are pure (tested without root); `CallerNetwork` runs them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

SUBNET_PREFIX = "10.213"
BURST = "16kbit"  # tbf's bucket: two 1,000-byte packets; more would let a burst through unshaped
QUEUE_LATENCY = "200ms"  # tbf drops what waits longer: a shaped link that falls behind loses, not queues
BLACKHOLE_TAG = "cadence-blackhole"


@dataclass(frozen=True)
class LinkProfile:
    """What the caller's link does to packets: `loss` (0-1) each way, `rate_kbit` each way."""
    loss: float = 0.0
    rate_kbit: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss < 1.0:
            raise ValueError(f"loss is a fraction in [0, 1), not {self.loss}")
        if self.rate_kbit is not None and self.rate_kbit <= 0:
            raise ValueError(f"rate_kbit must be positive, not {self.rate_kbit}")

    def describe(self) -> str:
        parts = [f"{self.loss:.0%} loss"] + ([f"{self.rate_kbit} kbit/s"] if self.rate_kbit else [])
        return ", ".join(parts)


@dataclass(frozen=True)
class Names:
    namespace: str
    host_link: str  # the veth end on the host
    caller_link: str  # the veth end in the namespace
    subnet: int  # N of 10.213.N.0/24

    @property
    def host_ip(self) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.1"

    @property
    def caller_ip(self) -> str:
        return f"{SUBNET_PREFIX}.{self.subnet}.2"

    @classmethod
    def for_process(cls, pid: int, subnet: int) -> Names:
        # Interface names are at most 15 bytes; the pid keeps parallel runs apart.
        return cls(f"cadence-caller-{pid}-{subnet}", f"cdh{pid}x{subnet}", f"cdc{pid}x{subnet}", subnet)


def setup_commands(n: Names) -> list[list[str]]:
    return [
        ["ip", "netns", "add", n.namespace],
        ["ip", "link", "add", n.host_link, "type", "veth", "peer", "name", n.caller_link],
        ["ip", "link", "set", n.caller_link, "netns", n.namespace],
        ["ip", "addr", "add", f"{n.host_ip}/24", "dev", n.host_link],
        ["ip", "link", "set", n.host_link, "up"],
        ["ip", "netns", "exec", n.namespace, "ip", "addr", "add", f"{n.caller_ip}/24", "dev", n.caller_link],
        ["ip", "netns", "exec", n.namespace, "ip", "link", "set", n.caller_link, "up"],
        ["ip", "netns", "exec", n.namespace, "ip", "link", "set", "lo", "up"],
    ]


def teardown_commands(n: Names) -> list[list[str]]:
    # Deleting the namespace deletes its veth end, and with it the pair and the host's qdisc.
    return [["ip", "netns", "del", n.namespace]]


def _in_namespace(n: Names, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", n.namespace, *argv]


def shape_commands(n: Names, profile: LinkProfile) -> list[list[str]]:
    """Commands that put `profile` on a link that has none (see `clear_shape_commands`)."""
    commands = []
    if profile.loss > 0:
        for chain in ("INPUT", "OUTPUT"):
            commands.append(_in_namespace(n, ["iptables", "-A", chain, "-m", "statistic", "--mode", "random",
                                              "--probability", f"{profile.loss:.4f}", "-j", "DROP"]))
    if profile.rate_kbit:
        tbf = ["root", "tbf", "rate", f"{profile.rate_kbit}kbit", "burst", BURST, "latency", QUEUE_LATENCY]
        commands.append(["tc", "qdisc", "add", "dev", n.host_link, *tbf])
        commands.append(_in_namespace(n, ["tc", "qdisc", "add", "dev", n.caller_link, *tbf]))
    return commands


def clear_shape_commands(n: Names) -> list[list[str]]:
    """Commands that take any profile off; each may fail harmlessly (nothing to remove)."""
    return [_in_namespace(n, ["iptables", "-F", "INPUT"]), _in_namespace(n, ["iptables", "-F", "OUTPUT"]),
            ["tc", "qdisc", "del", "dev", n.host_link, "root"],
            _in_namespace(n, ["tc", "qdisc", "del", "dev", n.caller_link, "root"])]


def blackhole_commands(n: Names, *, on: bool) -> list[list[str]]:
    """Drops (on) or lets through again (off) every packet in and out of the namespace. Rules
    go first in their chains, so the link's loss rules stay as they were underneath."""
    action = ["-I", "{chain}", "1"] if on else ["-D", "{chain}"]
    return [_in_namespace(n, ["iptables", *[a.format(chain=chain) for a in action], "-m", "comment", "--comment",
                              BLACKHOLE_TAG, "-j", "DROP"])
            for chain in ("INPUT", "OUTPUT")]


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "tc", "iptables") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: iproute2, iptables; `make setup` installs them as root)"
    return None


def _free_subnet() -> int:
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    for subnet in range(1, 255):
        if f" {SUBNET_PREFIX}.{subnet}." not in used:
            return subnet
    raise RuntimeError(f"every {SUBNET_PREFIX}.N.0/24 subnet is in use on this host")


def _run(argv: list[str], *, check: bool = True) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


class CallerNetwork:
    """A namespace for one caller. Use `create()` as a context manager: it is always removed."""

    def __init__(self, names: Names) -> None:
        self.names = names
        self.profile = LinkProfile()
        self.blackholed = False

    @property
    def host_ip(self) -> str:
        return self.names.host_ip

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace."""
        return _in_namespace(self.names, argv)

    def shape(self, profile: LinkProfile) -> None:
        for argv in clear_shape_commands(self.names):
            _run(argv, check=False)
        for argv in shape_commands(self.names, profile):
            _run(argv)
        self.profile = profile
        if self.blackholed:  # the flush above took it away
            self.blackholed = False
            self.blackhole(True)

    def blackhole(self, on: bool) -> None:
        if on == self.blackholed:
            return
        for argv in blackhole_commands(self.names, on=on):
            _run(argv)
        self.blackholed = on


@contextlib.contextmanager
def create() -> Iterator[CallerNetwork]:
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"cannot make a caller network: {reason}")
    names = Names.for_process(os.getpid(), _free_subnet())
    try:
        for argv in setup_commands(names):
            _run(argv)
        yield CallerNetwork(names)
    finally:
        for argv in teardown_commands(names):
            _run(argv, check=False)
