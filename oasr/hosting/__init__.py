"""Hosting: one ``EngineCore`` (``core.py``) behind every way the engine is run.

The core holds one ``oasr.engine.combined.Engine`` and speaks typed messages (``protocol.py``): requests, aborts,
option checks, word alignments and live streams in; one ``CoreUpdate`` per client per step out. It is driven by
one loop (``loop.py``). The transports carry the same messages to it and differ only in how they travel:

- ``inproc.py``: the loop on a thread of this process (``oasr serve --engine-mode thread``);
- ``mp.py`` + ``process.py``: the loop in a process of its own, over ZeroMQ (the server's default), supervised:
  a core that dies is started again (``supervisor.py``);
- ``ray_replicas.py``: the loop in Ray actors, one per replica, behind one least-loaded router.

Every transport's client is a ``CoreClient`` (``client.py``), which turns updates back into each request's
outputs and each stream's events on the caller's event loop: the engine-client interface the HTTP layer uses
(``engine_client.py``). The client side imports no torch, so the server's API processes stay light.
"""
