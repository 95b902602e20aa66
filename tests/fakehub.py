"""A small Hugging Face Hub stand-in on loopback, so the real huggingface_hub client code runs in tests.

It speaks the three calls rsinfer's resolution makes: model info (`GET /api/models/{repo}/revision/{rev}`)
and file metadata / download (`HEAD|GET /{repo}/resolve/{rev}/{path}`, byte ranges too), with the Hub's error
headers.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class FakeRepo:
    revisions: dict[str, dict[str, bytes]]          # revision name → {path: content}
    gated_token: str | None = None                  # files need `Authorization: Bearer <token>`
    commits: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for rev, files in self.revisions.items():
            digest = hashlib.sha1((rev + "|".join(sorted(files))).encode()).hexdigest()
            self.commits[rev] = digest

    def lookup(self, rev: str) -> tuple[str, dict[str, bytes]] | None:
        for name, commit in self.commits.items():
            if rev in (name, commit):
                return commit, self.revisions[name]
        return None


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, authorization)
        self.ranges: list[tuple[str, int, int]] = []             # (file, first byte, last byte) of each range GET
        self._server: ThreadingHTTPServer | None = None

    def add(self, repo_id: str, files: dict[str, bytes], *, revisions: dict[str, dict[str, bytes]] | None = None,
            gated_token: str | None = None) -> FakeRepo:
        repo = FakeRepo({"main": files, **(revisions or {})}, gated_token=gated_token)
        self.repos[repo_id] = repo
        return repo

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
                      head: bool = False) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Connection", "close")  # no keep-alive: stop() really takes the Hub away
                self.close_connection = True
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _error(self, status: int, code: str, message: str, head: bool) -> None:
                body = json.dumps({"error": message}).encode()
                self._send(status, body, {"X-Error-Code": code, "X-Error-Message": message,
                                          "Content-Type": "application/json"}, head)

            def _handle(self, head: bool) -> None:
                path = urlsplit(self.path).path
                hub.requests.append((self.command, path, self.headers.get("Authorization")))
                parts = [unquote(p) for p in path.strip("/").split("/")]
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
                    repo_id, rev = "/".join(parts[2:4]), "/".join(parts[5:])
                    repo = hub.repos.get(repo_id)
                    if repo is None:
                        return self._error(404, "RepoNotFound", f"Repository {repo_id} not found", head)
                    found = repo.lookup(rev)
                    if found is None:
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                    commit, files = found
                    info = {"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                            "gated": "manual" if repo.gated_token else False, "tags": [], "downloads": 0,
                            "likes": 0, "siblings": [{"rfilename": p} for p in sorted(files)]}
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo_id, rev, rel = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                    repo = hub.repos.get(repo_id)
                    if repo is None:
                        return self._error(404, "RepoNotFound", f"Repository {repo_id} not found", head)
                    if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
                        return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted", head)
                    found = repo.lookup(rev)
                    if found is None:
                        return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                    commit, files = found
                    if rel not in files:
                        return self._error(404, "EntryNotFound", f"{rel} does not exist", head)
                    body = files[rel]
                    etag = hashlib.sha1(body).hexdigest()
                    got = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
                    if got and not head:     # the Hub answers byte ranges (huggingface_hub resumes with them)
                        lo, hi = int(got[1]), min(int(got[2]), len(body) - 1)
                        hub.ranges.append((rel, lo, hi))
                        return self._send(206, body[lo:hi + 1], {"Content-Range": f"bytes {lo}-{hi}/{len(body)}",
                                                                 "Content-Type": "application/octet-stream"})
                    return self._send(200, body, {"X-Repo-Commit": commit, "ETag": f'"{etag}"',
                                                  "Content-Type": "application/octet-stream"}, head)
                return self._error(404, "NotFound", f"no route {path}", head)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self._handle(head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._handle(head=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fakehub", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
