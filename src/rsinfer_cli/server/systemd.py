"""systemd's notify protocol (sd_notify(3)): one datagram per message on the unix socket in $NOTIFY_SOCKET
(an abstract name when it starts with "@"). Nothing happens without the variable.

`serve` sends STATUS= lines while models load, READY=1 once every model is loaded and checked and the listening
sockets are bound, WATCHDOG=1 every half $WATCHDOG_USEC while the event loop answers (only when $WATCHDOG_PID
is unset or ours), RELOADING=1 and then READY=1 around a reload (SIGHUP), and STOPPING=1 when SIGTERM starts the
drain.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

log = logging.getLogger("rsinfer.server")


class Notifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        path = env.get("NOTIFY_SOCKET", "")
        self.address: str | None = None
        if path.startswith("@"):
            self.address = "\0" + path[1:]
        elif path.startswith("/"):
            self.address = path
        self.watchdog_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self._sock: socket.socket | None = None
        if self.address is not None:  # created now: loads on several threads report their status through it
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> None:
        if self.address is None or self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:  # systemd went away: never a reason to stop serving
            log.warning("sd_notify failed: %s", exc.strerror or exc)

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def ready(self, text: str) -> None:
        self.send("READY=1", f"STATUS={text}")

    def reloading(self) -> None:
        """A reload starts (Type=notify-reload wants the monotonic time with it); READY=1 says it ended."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", "STATUS=reloading the configuration")

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=draining requests in flight")

    async def watchdog(self) -> None:
        """WATCHDOG=1 every half the watchdog interval, from the event loop itself: a loop stuck for longer than
        the interval sends nothing, and systemd restarts the service."""
        if self.watchdog_s is None or self.address is None:
            return
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(self.watchdog_s / 2)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
