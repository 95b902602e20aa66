"""OpenAI batch files run through the daemon's own routes, in this process (`rsinfer batch`, as vLLM's
`run_batch`): each line `{custom_id, method, url, body}` is sent to the app `rsinfer serve` would run on the same
config, over a Unix socket in a private folder (no network port), a bounded number at once so the scheduler
batches them; each answer is a line `{id, custom_id, response: {status_code, request_id, body}, error}` in the
input's order: the same bodies the server gives.

The whole file is checked before any model loads (JSON objects, a unique string custom_id, POST, a body object)
and every url against the app's routes before any request runs: a bad line stops the run naming it, with nothing
written. With an output file, a rerun appends only the requests it does not answer yet (a line cut short by a
kill is dropped first): every custom_id answered exactly once.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..errors import ConfigError, InputError

if TYPE_CHECKING:
    from aiohttp import ClientSession, web

    from ..config import Config

MAX_LINE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Request:
    line: int
    custom_id: str
    url: str
    body: bytes


def read_requests(path: Path) -> list[Request]:
    """The batch file's requests, each line checked; InputError naming the first bad line."""
    from ..jsonio import dumps, loads

    seen: dict[str, int] = {}
    out: list[Request] = []
    for lineno, raw in _lines(path):
        if not raw.strip():
            continue
        where = f"{path}: line {lineno}"
        try:
            obj = loads(raw)
        except ValueError as exc:
            raise InputError(f"{where}: not valid JSON ({str(exc).splitlines()[0]})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        cid, method, url, body = (obj.get(k) for k in ("custom_id", "method", "url", "body"))
        if not isinstance(cid, str) or not cid:
            raise InputError(f"{where}: `custom_id` must be a non-empty string")
        if cid in seen:
            raise InputError(f"{where}: custom_id '{cid}' again (first on line {seen[cid]}); each must be unique")
        if (method or "POST").upper() != "POST":
            raise InputError(f"{where}: `method` must be POST, got {method!r}")
        if not isinstance(url, str) or not url.startswith("/"):
            raise InputError(f"{where}: `url` must be a path such as /v1/embeddings, got {url!r}")
        if not isinstance(body, dict):
            raise InputError(f"{where}: `body` must be a JSON object")
        seen[cid] = lineno
        out.append(Request(lineno, cid, url, dumps(body)))
    return out


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    with stream:
        for lineno, raw in enumerate(stream, start=1):
            if len(raw) > MAX_LINE_BYTES:
                raise InputError(f"{path}: line {lineno}: over {MAX_LINE_BYTES >> 20} MiB")
            yield lineno, raw


def answered(output: Path) -> set[str]:
    """The custom_ids an earlier run wrote to `output`; a last line cut short (the run was killed) is cut off."""
    from ..jsonio import loads

    if not output.exists():
        return set()
    done: set[str] = set()
    keep = 0
    with open(output, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                obj = loads(raw)
            except ValueError:
                raise InputError(f"--output {output}: a line at byte {keep} is not JSON; not a batch output of "
                                 "rsinfer") from None
            if isinstance(obj, dict) and isinstance(obj.get("custom_id"), str):
                done.add(obj["custom_id"])
            keep += len(raw)
    if keep < output.stat().st_size:
        os.truncate(output, keep)
    return done


def unknown_routes(app: web.Application, requests: list[Request]) -> str | None:
    """The first request whose url no POST route of the app answers, as a message; None when all do."""
    from aiohttp.test_utils import make_mocked_request

    loop = asyncio.new_event_loop()
    try:
        for r in requests:
            match = loop.run_until_complete(app.router.resolve(make_mocked_request("POST", r.url, app=app)))
            if match.http_exception is not None:
                return f"line {r.line}: no POST route {r.url} (HTTP {match.http_exception.status})"
    finally:
        loop.close()
    return None


async def run(app: web.Application, requests: list[Request], out: IO[str], concurrency: int) -> tuple[int, int]:
    """Every request through `app`, answers written in the requests' order; (answered, not 2xx)."""
    import aiohttp
    from aiohttp import web

    from .run import app_runner

    runner = await app_runner(app, drain_s=5.0)       # as `rsinfer serve` runs the app
    with tempfile.TemporaryDirectory(prefix="rsinfer-batch-") as folder:
        sock = str(Path(folder) / "app.sock")
        await web.UnixSite(runner, sock).start()
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=sock, limit=concurrency)) as s:
                return await _send_all(s, requests, out, concurrency)
        finally:
            await runner.cleanup()


async def _send_all(session: ClientSession, requests: list[Request], out: IO[str],
                    concurrency: int) -> tuple[int, int]:
    from ..jsonio import dumps_line

    pending: dict[int, asyncio.Task[dict[str, Any]]] = {}
    failed = written = 0
    for i, r in enumerate(requests):      # at most `concurrency` in flight; written as the head completes
        pending[i] = asyncio.ensure_future(_send(session, r))
        while len(pending) >= concurrency or (i == len(requests) - 1 and pending):
            head = min(pending)
            line = await pending.pop(head)
            failed += line["response"]["status_code"] >= 300 if line["response"] else 1
            out.write(dumps_line(line))
            out.flush()
            written += 1
    return written, failed


async def _send(session: ClientSession, r: Request) -> dict[str, Any]:
    from ..jsonio import loads

    line: dict[str, Any] = {"id": f"batch_req_{secrets.token_hex(12)}", "custom_id": r.custom_id,
                            "response": None, "error": None}
    async with session.post(f"http://rsinfer{r.url}", data=r.body,
                            headers={"Content-Type": "application/json"}) as resp:
        raw = await resp.read()
        try:
            body = loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        line["response"] = {"status_code": resp.status, "request_id": resp.headers.get("x-request-id"),
                            "body": body}
    return line


def run_batch(config: Config, input_: Path, output: Path | None, concurrency: int) -> tuple[int, int, int]:
    """`rsinfer batch`: (answered now, of them not 2xx, skipped as answered before)."""
    import sys

    from ..engine.registry import Registry
    from ..engine.threads import limit_tokenizer_threads, usable_cpus
    from ..runtime import Runtime
    from .app import create_app
    from .metrics import Metrics
    from .run import run_loop

    requests = read_requests(input_)
    done = answered(output) if output is not None else set()
    todo = [r for r in requests if r.custom_id not in done]
    limit_tokenizer_threads(usable_cpus())
    app = create_app(Runtime(config, Registry.load(config), Metrics()))
    bad = unknown_routes(app, todo)
    if bad is not None:
        raise InputError(f"{input_}: {bad}")
    stream = open(output, "a", encoding="utf-8") if output is not None else sys.stdout  # noqa: SIM115
    try:
        written, failed = run_loop(run(app, todo, stream, concurrency), config.server.event_loop)
    finally:
        if output is not None:
            stream.close()
    return written, failed, len(requests) - len(todo)
