"""valkey-server with the module, on a free loopback port, for tests.

Used by this package's tests, the web-app tests and the patched `limits`
suite (scripts/test-clients.sh puts this directory on PYTHONPATH). The binary
is $VALKEY_SERVER (default: valkey-server on PATH), the module $RL_MODULE.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import valkey


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """A running valkey-server; ``cluster=True`` makes it a one-node cluster owning ``slots``
    (first and last; default every slot)."""

    def __init__(self, port: int | None = None, *, cluster: bool = False, slots: tuple[int, int] = (0, 16383)) -> None:
        self.port = port or free_port()
        self.bus_port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="valkey-ratelimit-test-"))
        args = [
            os.environ.get("VALKEY_SERVER") or "valkey-server",
            *("--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no"),
            *("--dir", str(self.dir), "--logfile", str(self.dir / "valkey.log")),
            *("--loadmodule", os.environ["RL_MODULE"]),
        ]
        if cluster:
            # The bus port defaults to port + 10000, which may not exist.
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
            args += ["--cluster-port", str(self.bus_port)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # valkey-py types its command methods only partly: the client is used as Any.
        self.client: Any = cast(Any, valkey.Valkey("127.0.0.1", self.port))
        self._wait_until_up()
        if cluster:
            self.client.execute_command("CLUSTER", "ADDSLOTSRANGE", *slots)
            if slots == (0, 16383):
                self._wait_for(self.cluster_ok)

    def cluster_ok(self, nodes: int = 1) -> bool:
        info = self.client.execute_command("CLUSTER", "INFO")
        return b"cluster_state:ok" in info and f"cluster_known_nodes:{nodes}\r".encode() in info

    @property
    def url(self) -> str:
        return f"valkey://127.0.0.1:{self.port}"

    def _wait_until_up(self) -> None:
        def up() -> bool:
            try:
                return bool(self.client.ping())
            except valkey.ConnectionError:
                if self.process.poll() is not None:
                    log = (self.dir / "valkey.log").read_text()[-2000:]
                    self.stop()
                    raise RuntimeError(f"valkey-server did not start on port {self.port}:\n{log}") from None
                return False

        self._wait_for(up)

    def _wait_for(self, condition: object) -> None:
        assert callable(condition)
        for _ in range(200):
            if condition():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"valkey-server on port {self.port} did not get ready")

    def stop(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class Cluster:
    """A cluster of ``primaries`` servers on loopback, each owning an equal range of slots (as
    ``valkey-cli --cluster create`` assigns them), met and ``cluster_state:ok``; always stopped,
    also when it fails to form."""

    def __init__(self, primaries: int = 3) -> None:
        self.nodes: list[Server] = []
        try:
            for i in range(primaries):
                slots = (i * 16384 // primaries, (i + 1) * 16384 // primaries - 1)
                self.nodes.append(Server(cluster=True, slots=slots))
            first = self.nodes[0]
            for node in self.nodes[1:]:
                first.client.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
            for node in self.nodes:
                node._wait_for(lambda n=node: n.cluster_ok(primaries))
        except BaseException:
            self.stop()
            raise

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
