"""Network partitions for the soak: processes in network namespaces of their own.

With `--partition`, the soak builds three network namespaces, each joined to
the host by veth pairs (nothing leaves the machine):

- a *worker cell* holding one of the two workers, and a *sink cell* holding
  the SMTP sink; each has a `db` link (PostgreSQL listens on its host side)
  and a `net` link (its default route: the broker, and for the sink the
  harness's SMTP clients);
- a *broker cell* holding Redis, reached by every process through the host,
  which forwards between the cells.

A partition takes the cell's side of a link down: packets already in flight
are dropped without an answer (established connections hang, as across a
real partition), new connections fail at once, and the PostgreSQL or Redis
side hears nothing. Healing brings the link up again. The cells are deleted
when the soak ends, also when it fails; `ip_forward` is put back as it was.

Needs root and `ip` (iproute2); `ip netns add` must be allowed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
PARTITIONS = ("partition_worker_db", "partition_sink_db", "partition_broker")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Link:
    ns: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    default: bool


@dataclass
class Cell:
    """One network namespace and its links to the host."""

    name: str
    links: dict[str, Link] = field(default_factory=dict)

    def __post_init__(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", self.name)  # left over by a soak that was killed
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")

    def link(self, key: str, host_ip: str, ns_ip: str, *, default: bool = False) -> Link:
        host_if, ns_if = f"{self.name}{key}h", f"{self.name}{key}n"
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", host_if)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", self.name)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", self.name, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _ip("-n", self.name, "link", "set", ns_if, "up")
        link = Link(self.name, host_if, ns_if, host_ip, ns_ip, default)
        if default:
            _ip("-n", self.name, "route", "add", "default", "via", host_ip)
        self.links[key] = link
        return link

    def prefix(self) -> list[str]:
        """What a command is run under to live in this cell."""
        return ["ip", "netns", "exec", self.name]

    def cut(self, key: str) -> None:
        _ip("-n", self.name, "link", "set", self.links[key].ns_if, "down")

    def heal(self, key: str) -> None:
        link = self.links[key]
        _ip("-n", self.name, "link", "set", link.ns_if, "up")
        if link.default:
            # A link going down takes its routes with it; the connected one
            # comes back with the link, the default one does not.
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("-n", self.name, "route", "add", "default", "via", link.host_ip)

    def close(self) -> None:
        for link in self.links.values():
            with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
                _ip("link", "del", link.host_if)
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            _ip("netns", "del", self.name)


class Partitions:
    """The soak's three cells; `cut(kind, seconds)` partitions, waits and heals."""

    def __init__(self) -> None:
        tag = os.getpid() % 1000
        octet = 200 + os.getpid() % 50

        def net(i: int, host: int) -> str:
            return f"10.{octet}.{i}.{host}"

        self._forward = FORWARD.read_text().strip()
        self.cells: list[Cell] = []
        try:
            self.worker = self._cell(f"sbx{tag}w")
            self.worker.link("d", net(1, 1), net(1, 2))
            self.worker.link("n", net(2, 1), net(2, 2), default=True)
            self.sink = self._cell(f"sbx{tag}s")
            self.sink.link("d", net(3, 1), net(3, 2))
            self.sink.link("n", net(4, 1), net(4, 2), default=True)
            self.broker = self._cell(f"sbx{tag}b")
            self.broker.link("n", net(5, 1), net(5, 2), default=True)
            FORWARD.write_text("1\n")
        except BaseException:
            self.close()
            raise

    def _cell(self, name: str) -> Cell:
        cell = Cell(name)
        self.cells.append(cell)
        return cell

    @property
    def postgres_hosts(self) -> list[str]:
        """Where PostgreSQL must listen for the cells (beside its unix socket)."""
        return [self.worker.links["d"].host_ip, self.sink.links["d"].host_ip]

    @property
    def broker_host(self) -> str:
        return self.broker.links["n"].ns_ip

    @property
    def sink_host(self) -> str:
        return self.sink.links["n"].ns_ip

    def cut(self, kind: str, seconds: float) -> str:
        cell, key, what = {
            "partition_worker_db": (self.worker, "d", "a worker and PostgreSQL"),
            "partition_sink_db": (self.sink, "d", "the SMTP sink and PostgreSQL"),
            "partition_broker": (self.broker, "n", "every process and the broker"),
        }[kind]
        cell.cut(key)
        try:
            time.sleep(seconds)
        finally:
            cell.heal(key)
        return f"network partition between {what} for {seconds:.0f} s, then healed"

    def close(self) -> None:
        for cell in self.cells:
            cell.close()
        with contextlib.suppress(OSError):
            FORWARD.write_text(self._forward + "\n")
