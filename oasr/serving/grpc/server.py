"""The gRPC server beside uvicorn: a ``grpc.aio`` server on the same event loop, started once HTTP listens and
stopped when the HTTP server shuts down (after /health says ``draining``, so new calls are answered UNAVAILABLE
while calls in flight get the same grace period as HTTP requests)."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc

from oasr.errors import OASRError
from oasr.serving.connections import GRACEFUL_SHUTDOWN_S
from oasr.serving.grpc.protos import riva_asr_pb2_grpc
from oasr.serving.grpc.service import RivaASRService
from oasr.serving.lifecycle import ServerLifecycle
from oasr.serving.realtime.connection import RealtimeService
from oasr.serving.settings import GrpcSettings

log = logging.getLogger(__name__)


class GrpcStartError(OASRError):
    """The gRPC port could not be bound, or its certificate or key not read."""


class GrpcFrontEnd:
    """``start``/``stop`` on the server's event loop; ``port`` is the one bound (the asked one)."""

    def __init__(self, realtime: RealtimeService, lifecycle: ServerLifecycle, settings: GrpcSettings,
                 host: str) -> None:
        self.settings = settings
        self.host = host
        self.service = RivaASRService(realtime, lifecycle)
        self.server: grpc.aio.Server | None = None
        self.port: int | None = None
        max_bytes = realtime.serving.settings.max_upload_bytes  # a Recognize's audio: an upload's limit
        self._options = [("grpc.max_receive_message_length", max_bytes), ("grpc.so_reuseport", 0)]

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.settings.port}"

    @property
    def url(self) -> str:
        return f"{'grpcs' if self.settings.cert_file else 'grpc'}://{self.address}"

    async def start(self) -> None:
        server = grpc.aio.server(options=self._options)
        riva_asr_pb2_grpc.add_RivaSpeechRecognitionServicer_to_server(self.service, server)
        try:
            if self.settings.cert_file is not None:
                credentials = grpc.ssl_server_credentials(
                    [(Path(self.settings.key_file).read_bytes(), Path(self.settings.cert_file).read_bytes())])
                self.port = server.add_secure_port(self.address, credentials)
            else:
                self.port = server.add_insecure_port(self.address)
        except (OSError, RuntimeError) as exc:
            raise GrpcStartError(f"cannot serve gRPC on {self.address}: {exc}") from None
        if not self.port:  # grpc says 0 for a port it could not bind
            raise GrpcStartError(f"cannot serve gRPC on {self.address}: the port is taken or not allowed")
        await server.start()
        self.server = server
        log.info("gRPC (Riva ASR) on %s", self.url)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(GRACEFUL_SHUTDOWN_S)
            self.server = None
