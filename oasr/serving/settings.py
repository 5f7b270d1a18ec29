"""What the HTTP server admits: one frozen dataclass, validated when built, never changed while serving."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from oasr.serving.server_decoding import ServerDecoding

KIB = 1 << 10
MIB = 1 << 20
# A request head's limit: 4 times nginx's default (4 buffers of 8 KiB), room for long cookies and tokens.
DEFAULT_MAX_HEAD_KB = 64
# OpenAI's own upload limit for /v1/audio/*.
DEFAULT_MAX_UPLOAD_MB = 25
# The Host names a server listening on loopback answers by default: a page on another site that rebinds its
# DNS name to 127.0.0.1 still sends its own name, and is refused.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"


# OpenAI's own cap on one Realtime client event (an ``input_audio_buffer.append`` carries at most this much).
DEFAULT_MAX_EVENT_MB = 15


@dataclass(frozen=True)
class RealtimeSettings:
    """``GET /v1/realtime?intent=transcription`` (WebSocket): what one server and one session may hold."""

    max_sessions: int = 64  # sessions open at once; more are refused (429) before the socket is accepted
    # Sessions one client (peer address) or one API key may have open at once; more are refused (429) before the
    # socket is accepted, so one client cannot take every session. None: no cap. Behind a reverse proxy every
    # client has the proxy's address (as for the HTTP caps).
    max_sessions_per_client: int | None = 16
    max_sessions_per_key: int | None = 32
    max_buffer_s: float = 120.0  # audio one uncommitted buffer holds; an append past it gets an error event
    # Committed turns of one session not yet answered (queued, or being transcribed), and their audio. A commit
    # past either gets an error event (a turn the server VAD cut is dropped, with one) until the backlog drains,
    # so a client sending audio faster than it is transcribed cannot queue without bound.
    max_pending_turns: int = 8
    max_pending_audio_s: float = 240.0
    max_event_bytes: int = DEFAULT_MAX_EVENT_MB * MIB  # larger client events get an error event
    # The socket's own frame limit: frames up to it are read and answered (an error event past
    # ``max_event_bytes``), larger ones close the socket (1009). Above max_event_bytes, so a client one event
    # too large hears why.
    max_frame_bytes: int = 2 * DEFAULT_MAX_EVENT_MB * MIB
    idle_timeout_s: float = 300.0  # a session whose client sends nothing this long (no turn running) is closed
    vad: str = "silero"  # the VAD detector (``oasr.vad`` registry) behind server_vad turn detection

    def __post_init__(self) -> None:
        for name in ("max_sessions", "max_event_bytes", "max_pending_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"RealtimeSettings.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_sessions_per_client", "max_sessions_per_key"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"RealtimeSettings.{name} must be >= 1 or None, got {getattr(self, name)}")
        for name in ("max_buffer_s", "idle_timeout_s", "max_pending_audio_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RealtimeSettings.{name} must be > 0, got {getattr(self, name)}")
        if self.max_frame_bytes < self.max_event_bytes:
            raise ValueError(f"RealtimeSettings.max_frame_bytes ({self.max_frame_bytes}) must be at least "
                             f"max_event_bytes ({self.max_event_bytes})")


@dataclass(frozen=True)
class GrpcSettings:
    """``oasr serve --grpc-port``: the Riva ASR gRPC service beside HTTP (``oasr.serving.grpc``), on the same host."""

    port: int
    cert_file: str | None = None  # PEM certificate chain and key: TLS through grpc's own credentials
    key_file: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"GrpcSettings.port must be in 1..65535, got {self.port}")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("--grpc-cert and --grpc-key go together (TLS needs both)")


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str  # the id /v1/models lists and requests name in ``model``
    model_aliases: tuple[str, ...] = ("whisper-1",)  # also accepted in ``model`` (OpenAI clients' default)
    api_keys: tuple[str, ...] = ()  # when any, /v1/* needs ``Authorization: Bearer <one of them>``
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_MB * MIB  # request body size; larger bodies get 413
    max_audio_seconds: float = 3600.0  # decoded audio longer than this gets 400
    # Transcription requests admitted at once (queued or decoding); more get 429. A request takes its place
    # once its upload is complete, so clients still sending theirs hold none.
    max_in_flight: int = 256
    # Transcription requests one client (peer address) or one API key has open at once, from its headers to its
    # answer (uploading included); more get 429, so one client cannot take every place. None: no cap. Behind a
    # reverse proxy every client has the proxy's address, unless uvicorn reads it from X-Forwarded-For.
    max_in_flight_per_client: int | None = 64
    max_in_flight_per_key: int | None = 128
    request_timeout_s: float = 600.0  # a request still running this long after admission is aborted with 504
    body_timeout_s: float = 60.0  # a request body not received this long after its headers gets 408
    # A connection that has not sent a whole request head this long after it opened (or after the first byte of
    # a later request on it) is answered 408 and closed; uvicorn itself only times out idle keep-alive ones.
    header_timeout_s: float = 10.0
    # The most a request head (request line and headers) may take; a longer one gets 431 and the connection is
    # closed (uvicorn's httptools parser has no limit of its own, and buffers a header line whole).
    max_head_bytes: int = DEFAULT_MAX_HEAD_KB * KIB
    retry_after_s: int = 1  # the Retry-After a 429 carries
    # Host header names answered (any port; "*": any host). Others get 400: see ``default_allowed_hosts``.
    allowed_hosts: tuple[str, ...] = (ANY_HOST,)
    cors_allow_origins: tuple[str, ...] = ()  # origins browsers may call from ("*": any); none: no CORS headers
    realtime: RealtimeSettings = RealtimeSettings()
    log_format: str = "text"  # the banner and access log of ``oasr serve``: "text" or "json" (``server_log``)
    # The diarization checkpoint /v1/audio/diarization runs (None: that route answers 404), and its device.
    diarization_model: str | None = None
    diarization_device: str = "auto"
    # --punctuate: a FunASR CT-Transformer folder whose punctuation is added to the answers of a model that writes
    # none, in each HTTP worker on its CPU (None: answers as decoded)
    punctuate: str | None = None
    grpc: GrpcSettings | None = None  # None: no gRPC service
    # --lm / --lexicon / --decoding-graph: the search every transcription decodes with (None: the request's own)
    decoding: ServerDecoding | None = None

    def __post_init__(self) -> None:
        if self.log_format not in ("text", "json"):
            raise ValueError(f"ServerSettings.log_format must be 'text' or 'json', got {self.log_format!r}")
        if not self.served_model_name:
            raise ValueError("ServerSettings.served_model_name must not be empty")
        for name in ("max_upload_bytes", "max_in_flight", "retry_after_s", "max_head_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerSettings.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_in_flight_per_client", "max_in_flight_per_key"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"ServerSettings.{name} must be >= 1 or None, got {getattr(self, name)}")
        for name in ("max_audio_seconds", "request_timeout_s", "body_timeout_s", "header_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServerSettings.{name} must be > 0, got {getattr(self, name)}")
        if any(not key.strip() for key in self.api_keys):
            raise ValueError("ServerSettings.api_keys must not be blank (leave them out for an open server)")
        if not self.allowed_hosts or any(not host.strip() for host in self.allowed_hosts):
            raise ValueError(f"ServerSettings.allowed_hosts needs host names ('*' for any), got {self.allowed_hosts}")

    def accepts_model(self, name: str) -> bool:
        return name == self.served_model_name or name in self.model_aliases


def default_allowed_hosts(listen_host: str) -> tuple[str, ...]:
    """Loopback names when the server listens on a loopback address (nobody else can reach it, except a
    browser tricked by DNS rebinding), any host otherwise."""
    if listen_host.lower() == "localhost":
        return LOOPBACK_HOSTS
    try:
        loopback = ipaddress.ip_address(listen_host.strip("[]")).is_loopback
    except ValueError:  # a host name: whatever it resolves to, clients name it
        return (ANY_HOST,)
    return LOOPBACK_HOSTS if loopback else (ANY_HOST,)
