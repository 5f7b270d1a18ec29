"""What ``/health`` reports: the server's state, one of ``ServerState``, read from the engine client and from
the server's own shutdown.

- ``starting``: the engine is not ready yet, or is restarting (an engine client that supervises a core it
  restarts reports it as its ``state``).
- ``ok``: requests are served.
- ``draining``: the server is shutting down (SIGTERM or Ctrl-C): requests in flight finish, new work should go
  elsewhere. Set once, never cleared.
- ``dead``: the engine has stopped and nothing restarts it.

Only ``ok`` is answered with 200; a load balancer or an orchestrator's readiness probe takes the others off.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oasr.serving.serving import OpenAIServingTranscription


class ServerState(str, enum.Enum):
    STARTING = "starting"
    OK = "ok"
    DRAINING = "draining"
    DEAD = "dead"


# What an engine client's own ``state`` may say ("starting" | "ok" | "dead"), as the server reads it.
_ENGINE_STATES = {"starting": ServerState.STARTING, "ok": ServerState.OK, "dead": ServerState.DEAD}


class ServerLifecycle:
    """The state of one app (``app.state.lifecycle``): the serving object's view of its engine, unless the
    server is draining. ``drain()`` is called by the server when it starts shutting down."""

    def __init__(self, serving: OpenAIServingTranscription) -> None:
        self._serving = serving
        self._draining = False

    def drain(self) -> None:
        self._draining = True

    @property
    def state(self) -> ServerState:
        if self._draining:
            return ServerState.DRAINING
        # An engine client that restarts its core says so in ``state``; the others only know ``alive``.
        reported = getattr(self._serving.engine, "state", None)
        engine_state = _ENGINE_STATES.get(reported, ServerState.OK) if isinstance(reported, str) else ServerState.OK
        if engine_state is ServerState.STARTING:
            return engine_state
        return engine_state if self._serving.healthy else ServerState.DEAD
