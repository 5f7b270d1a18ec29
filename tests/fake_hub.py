"""A Hugging Face Hub stand-in on 127.0.0.1 that speaks enough of the Hub's API for huggingface_hub's own client.

Routes, as huggingface_hub calls them (``hf_api.HfApi.model_info``/``list_repo_tree``, ``file_download``):
``GET /api/models/{repo}[/revision/{rev}]`` (commit sha and file list), ``GET /api/models/{repo}/tree/{rev}``
(one page, no ``Link`` header), and ``HEAD``/``GET /{repo}/resolve/{rev}/{file}`` with ``ETag``, ``X-Repo-Commit``
and ``Content-Length`` (no Xet headers, so the client downloads over plain HTTP), honouring ``Range: bytes=N-``
for resumed downloads. Errors carry the ``X-Error-Code`` the client maps to its exceptions (``RepoNotFound``,
``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo``). Every request is logged as (method, path).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class FakeRepo:
    """Revisions by branch name, each a {file name: content}; ``token``: gated, served only to that bearer."""

    revisions: dict[str, dict[str, bytes]]
    token: str | None = None

    @staticmethod
    def from_directory(directory: Path, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
        files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()}
        return {**files, **(extra or {})}

    def commit(self, branch: str) -> str:
        digest = hashlib.sha1(branch.encode())
        for name, content in sorted(self.revisions[branch].items()):
            digest.update(name.encode() + hashlib.sha256(content).digest())
        return digest.hexdigest()

    def resolve(self, revision: str) -> tuple[str, dict[str, bytes]] | None:
        """(commit sha, files) of a branch name or a commit sha."""
        for branch, files in self.revisions.items():
            if revision in (branch, self.commit(branch)):
                return self.commit(branch), files
        return None


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)

    def downloads(self, repo_id: str) -> list[str]:
        """The files of ``repo_id`` fetched with GET (the file bodies), in order."""
        marker = f"/{repo_id}/resolve/"
        return [path.split(marker, 1)[1].split("/", 1)[1] for method, path in self.requests
                if method == "GET" and path.startswith(marker)]


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub  # set on the subclass made per server

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append((self.command, path))
        if path.startswith("/api/models/"):
            self._api(path.removeprefix("/api/models/"))
        elif "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            revision, filename = rest.split("/", 1)
            self._file(repo_id, revision, filename, body)
        else:
            self._error(404, "RepoNotFound")

    def _api(self, rest: str) -> None:
        parts = rest.split("/")
        repo_id, tail = "/".join(parts[:2]), parts[2:]
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound")
        revision = tail[1] if len(tail) >= 2 and tail[0] in ("revision", "tree") else "main"
        resolved = repo.resolve(revision)
        if resolved is None:
            return self._error(404, "RevisionNotFound")
        sha, files = resolved
        if tail[:1] == ["tree"]:
            payload = [{"type": "file", "path": name, "size": len(content),
                        "oid": hashlib.sha1(content).hexdigest()} for name, content in sorted(files.items())]
        else:
            payload = {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                       "gated": "auto" if repo.token else False,
                       "siblings": [{"rfilename": name} for name in sorted(files)]}
        self._send(200, json.dumps(payload).encode(), {"Content-Type": "application/json"}, body=True)

    def _file(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound")
        if repo.token is not None and self.headers.get("Authorization") != f"Bearer {repo.token}":
            return self._error(401, "GatedRepo")
        resolved = repo.resolve(revision)
        if resolved is None:
            return self._error(404, "RevisionNotFound")
        sha, files = resolved
        if filename not in files:
            return self._error(404, "EntryNotFound", {"X-Repo-Commit": sha})
        content = files[filename]
        headers = {"ETag": f'"{hashlib.sha256(content).hexdigest()}"', "X-Repo-Commit": sha,
                   "Accept-Ranges": "bytes"}
        start = _range_start(self.headers.get("Range"))
        if body and start:
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
            return self._send(206, content[start:], headers, body=True)
        self._send(200, content, headers, body=body)

    def _error(self, status: int, code: str, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code, **(headers or {})}, True)

    def _send(self, status: int, content: bytes, headers: dict[str, str], body: bool) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(content))}.items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(content)


def _range_start(header: str | None) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    return int(header.removeprefix("bytes=").split("-", 1)[0] or 0)


@contextlib.contextmanager
def serving(hub: FakeHub) -> Iterator[str]:
    """Serves ``hub`` on a free loopback port in a thread; yields its endpoint URL (for ``HF_ENDPOINT``)."""
    handler = type("Handler", (_Handler,), {"hub": hub})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="fake-hub", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
