#!/usr/bin/env python3
"""Which of OASR's modules one realtime turn and one ``oasr.transcribe`` call pass through, how many
option objects each builds on the way, and which modules an option object is handed through (as an argument):
the trace behind a refactor's claim of "fewer modules, no double wrapping". Runs on the CPU with the embedded
tiny.en, the engine on a thread so one process sees every call.

    python scripts/trace_paths.py [--json]

Every function call of the process is profiled, so only the counts mean anything, not the time taken.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import soxr

OPTION_TYPES = {"DecodeOptions", "TranscribeOptions", "TranscriptionRequest", "StreamOptions", "WordTimingOptions",
                "RequestOptions", "TurnOptions"}


class Recorder:
    """Counts calls per ``oasr`` module and constructions of option objects, while ``on`` is set."""

    def __init__(self) -> None:
        self.on = False
        self.modules: Counter[str] = Counter()
        self.functions: set[str] = set()
        self.options: Counter[str] = Counter()
        self.builders: Counter[str] = Counter()  # "Type <- module.function" that built each option object
        self.carriers: set[str] = set()  # modules with a function called with an option object as an argument

    def profile(self, frame, event, arg):  # noqa: ANN001 - sys.setprofile's signature
        if not self.on or event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith("oasr"):
            self.modules[module] += 1
            self.functions.add(f"{module}.{frame.f_code.co_qualname}")
            # At a call event the frame's locals are its arguments: an option object among them was handed on.
            if frame.f_code.co_name != "__init__" and any(
                    type(value).__name__ in OPTION_TYPES and type(value).__module__.startswith("oasr")
                    for value in frame.f_locals.values()):
                self.carriers.add(module)
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            name = type(owner).__name__ if owner is not None else ""
            if name in OPTION_TYPES and type(owner).__module__.startswith("oasr"):
                self.options[name] += 1
                caller = frame.f_back
                while caller is not None and not caller.f_globals.get("__name__", "").startswith("oasr"):
                    caller = caller.f_back  # past dataclasses.replace and the generated __init__'s own frames
                if caller is not None:
                    self.builders[f"{name} <- {caller.f_globals['__name__']}.{caller.f_code.co_qualname}"] += 1

    def measure(self, action):
        self.modules.clear()
        self.functions.clear()
        self.options.clear()
        self.builders.clear()
        self.carriers.clear()
        self.on = True
        try:
            action()
        finally:
            self.on = False
        return {"modules": sorted(self.modules), "num_modules": len(self.modules),
                "num_functions": len(self.functions), "functions": sorted(self.functions),
                "num_calls": sum(self.modules.values()),
                "options_built": dict(self.options), "built_by": dict(self.builders),
                "option_carriers": sorted(self.carriers), "num_option_carriers": len(self.carriers)}


def realtime_turn(url: str, pcm: bytes) -> str:
    import websockets

    async def session() -> str:
        socket_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
        async with websockets.connect(socket_url, max_size=None) as ws:
            json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 24_000}, "turn_detection": None}}}}))
            json.loads(await ws.recv())
            for start in range(0, len(pcm), 4800):
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(pcm[start:start + 4800]).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            while True:
                event = json.loads(await ws.recv())
                if event["type"].endswith(("transcription.completed", "transcription.failed")):
                    return event.get("transcript", "")

    return asyncio.run(session())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a summary")
    args = parser.parse_args()
    recorder = Recorder()
    sys.setprofile(recorder.profile)
    threading.setprofile(recorder.profile)  # threads started from here on: the engine's, the server's

    import uvicorn

    import oasr
    from oasr.audio import load_audio
    from oasr.serving.app import build_app, start_engine
    from oasr.serving.settings import ServerSettings

    jfk = Path(oasr.__file__).parent / "assets" / "jfk.flac"
    audio = load_audio(jfk)
    pcm = (np.clip(soxr.resample(audio, 16_000, 24_000), -1, 1) * 32767).round().astype("<i2").tobytes()
    model = oasr.from_pretrained("tiny.en", device="cpu", dtype="float32")
    options = {"language": "en", "word_timestamps": True}
    oasr.transcribe([audio], model=model, **options)  # warm: the first call builds what later calls reuse
    results = {"transcribe": recorder.measure(lambda: oasr.transcribe([audio], model=model, **options))}

    engine = start_engine("tiny.en", mode="thread", device="cpu", dtype="float32")
    server = uvicorn.Server(uvicorn.Config(build_app(engine, ServerSettings(served_model_name="tiny.en")),
                                           host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.05)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        realtime_turn(url, pcm)  # warm
        results["realtime_turn"] = recorder.measure(lambda: realtime_turn(url, pcm))
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.shutdown()
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for name, result in results.items():
        print(f"{name}: {result['num_modules']} modules, {result['num_functions']} functions, "
              f"{result['num_calls']} calls; options built {result['options_built']}, handed through "
              f"{result['num_option_carriers']} modules")
        print("  option carriers: " + " ".join(m.removeprefix("oasr.") for m in result["option_carriers"]))
        print("  modules: " + " ".join(m.removeprefix("oasr.") for m in result["modules"]))
        for builder, count in sorted(result["built_by"].items()):
            print(f"  {count} x {builder}")


if __name__ == "__main__":
    main()
