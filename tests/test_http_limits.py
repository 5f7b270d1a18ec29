"""``oasr serve``'s HTTP front against a hostile client: request heads of any size, requests naming two hosts,
and the API description asked for without the key. Raw sockets send what ``httpx`` would not."""

from __future__ import annotations

import json
import select
import socket

import httpx
import pytest

from oasr.cli import _serve_settings, build_parser
from oasr.serving.app import build_app
from oasr.serving.settings import DEFAULT_MAX_HEAD_KB, KIB, ServerSettings
from serving_harness import WAIT_S, small_engine
from test_server_hardening import ANSWER_S, port_of, response_of, served

API_KEY = "test-key"
CHUNK = 64 * KIB


@pytest.fixture(scope="module")
def server():
    """tiny.en on a thread (no request here decodes audio), served as ``oasr serve`` configures uvicorn."""
    engine = small_engine("tiny.en", mode="thread")
    settings = ServerSettings(served_model_name="tiny.en", api_keys=(API_KEY,))
    try:
        with served(build_app(engine, settings), settings) as url:
            yield url
    finally:
        engine.shutdown()


def send_head(url: str, head: bytes) -> bytes:
    """Sends ``head`` a chunk at a time, stopping early once the server answers; its answer. The server drops
    what still comes after a refusal, so neither a send nor the read that follows meets a reset."""
    with socket.create_connection(("127.0.0.1", port_of(url)), timeout=ANSWER_S) as sock:
        for start in range(0, len(head), CHUNK):
            sock.sendall(head[start : start + CHUNK])
            if select.select([sock], [], [], 0)[0]:
                break
        return response_of(sock)


def health_head(*headers: str) -> bytes:
    lines = ["GET /health HTTP/1.1", *headers, "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


@pytest.mark.parametrize("size", [DEFAULT_MAX_HEAD_KB * KIB // 2, 8 << 20])
def test_a_request_head_over_the_limit_gets_431_and_one_under_it_is_served(server, size):
    answer = send_head(server, health_head("Host: 127.0.0.1", "X-Padding: " + "a" * size))
    if size < DEFAULT_MAX_HEAD_KB * KIB:
        assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]
    else:
        assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer[:200]
        assert answer.endswith(b"larger than this server accepts.")


def test_many_header_lines_count_toward_the_limit_too(server):
    lines = [f"X-Line-{n}: {'b' * 100}" for n in range(20_000)]  # 2.3 MB of short lines
    answer = send_head(server, health_head("Host: 127.0.0.1", *lines))
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_a_request_with_two_host_headers_gets_400(server):
    answer = send_head(server, health_head("Host: 127.0.0.1", "Host: attacker.example"))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer[:200]
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_host" and "2 Host headers" in error["message"]
    assert send_head(server, health_head("Host: 127.0.0.1")).startswith(b"HTTP/1.1 200 OK")


def test_the_api_description_needs_the_key_when_keys_are_set(server):
    missing = httpx.get(f"{server}/openapi.json", timeout=WAIT_S)
    wrong = httpx.get(f"{server}/openapi.json", headers={"Authorization": "Bearer nope"}, timeout=WAIT_S)
    keyed = httpx.get(f"{server}/openapi.json", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=WAIT_S)
    for refused in (missing, wrong):
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert refused.headers["www-authenticate"] == "Bearer"
    assert keyed.status_code == 200 and "/v1/audio/transcriptions" in keyed.json()["paths"]
    assert httpx.get(f"{server}/health", timeout=WAIT_S).status_code == 200  # still open


def test_the_header_limit_flag():
    def settings(*argv: str) -> ServerSettings:
        return _serve_settings(build_parser().parse_args(["serve", *argv]))

    assert settings().max_head_bytes == ServerSettings(served_model_name="m").max_head_bytes == 64 * KIB
    assert settings("--max-header-kb", "8").max_head_bytes == 8 * KIB
    with pytest.raises(ValueError, match="max_head_bytes"):
        settings("--max-header-kb", "0")
