"""A Riva client, run by the gRPC tests in the Riva venv (``.venv-riva``, which ``scripts/setup.sh`` makes: the
``nvidia-riva-client`` package pins a protobuf our venv cannot have). It drives a server with the package's own
``riva.client.Auth`` and ``riva.client.ASRService`` and prints what came back as one JSON object.

    python tests/riva_client.py '{"command": "recognize", "uri": "127.0.0.1:50051", ...}'

Commands: ``recognize`` (``audio``: a file's path, sent as its bytes, or raw 16-bit PCM with ``encoding``
LINEAR_PCM), ``stream`` (raw PCM in ``chunk_ms`` pieces), ``streams`` (``count`` streams of it at once, on
threads), ``cancel`` (a stream cancelled once ``after`` results have come), ``config``. A failed call prints
``{"error": {"code": NAME, "details": TEXT}}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import riva.client
from riva.client.asr import streaming_request_generator


def _service(args: dict) -> riva.client.ASRService:
    metadata = [["authorization", f"Bearer {args['key']}"]] if args.get("key") else None
    auth = riva.client.Auth(uri=args["uri"], use_ssl=bool(args.get("root_cert")),
                            ssl_root_cert=args.get("root_cert"), metadata_args=metadata)
    return riva.client.ASRService(auth)


def _config(args: dict) -> riva.client.RecognitionConfig:
    config = riva.client.RecognitionConfig(
        encoding=getattr(riva.client.AudioEncoding, args.get("encoding", "LINEAR_PCM")),
        sample_rate_hertz=args.get("sample_rate", 16_000), audio_channel_count=args.get("channels", 1),
        language_code=args.get("language", "en-US"), max_alternatives=1,
        enable_word_time_offsets=args.get("words", False), profanity_filter=args.get("profanity_filter", False),
        enable_automatic_punctuation=True)
    if args.get("encoding_number") is not None:  # a number outside the enum, as a broken client might send
        config.encoding = args["encoding_number"]
    riva.client.add_custom_configuration_to_config(config, args.get("custom", ""))
    if args.get("boosted_words"):  # word boosting, as Riva's sample clients' --boosted-lm-words / --boosted-lm-score
        riva.client.add_word_boosting_to_config(config, args["boosted_words"], args.get("boost", 0.0))
    riva.client.add_endpoint_parameters_to_config(config, 0, 0.0, args.get("stop_history", 0), 0, 0.0, 0.0)
    return config


def _alternative(alternative) -> dict:
    return {"transcript": alternative.transcript, "confidence": alternative.confidence,
            "words": [{"word": w.word, "start_time": w.start_time, "end_time": w.end_time,
                       "confidence": w.confidence} for w in alternative.words]}


def recognize(args: dict) -> dict:
    response = _service(args).offline_recognize(Path(args["audio"]).read_bytes(), _config(args))
    return {"results": [{**_alternative(r.alternatives[0]), "audio_processed": r.audio_processed}
                        for r in response.results]}


def _chunks(args: dict) -> list[bytes]:
    data = Path(args["audio"]).read_bytes()
    size = (args.get("sample_rate") or 16_000) * 2 * args.get("chunk_ms", 100) // 1000
    return [data[start : start + size] for start in range(0, len(data), size)]


def _paced(chunks: list[bytes], pause_s: float):
    for chunk in chunks:
        yield chunk
        time.sleep(pause_s)


def _streaming_config(args: dict) -> riva.client.StreamingRecognitionConfig:
    return riva.client.StreamingRecognitionConfig(config=_config(args), interim_results=True)


def stream(args: dict) -> dict:
    responses = _service(args).streaming_response_generator(
        _paced(_chunks(args), args.get("pause_s", 0.0)), _streaming_config(args))
    return {"responses": [{"transcript": r.alternatives[0].transcript, "is_final": r.is_final,
                           "stability": r.stability, "audio_processed": r.audio_processed}
                          for response in responses for r in response.results]}


def streams(args: dict) -> dict:
    """``count`` streams at once; each one's final transcripts, joined, or its error."""
    start = threading.Barrier(args["count"])

    def one(_: int) -> dict:
        start.wait()
        try:
            results = stream(args)["responses"]
        except grpc.RpcError as exc:
            return _error(exc)
        return {"final": " ".join(r["transcript"] for r in results if r["is_final"]),
                "num_interim": sum(not r["is_final"] for r in results)}

    with ThreadPoolExecutor(args["count"]) as pool:
        return {"streams": list(pool.map(one, range(args["count"])))}


def cancel(args: dict) -> dict:
    """A stream whose audio keeps coming slowly, cancelled by the client once ``after`` results have come."""
    service = _service(args)
    requests = streaming_request_generator(_paced(_chunks(args), 0.1), _streaming_config(args))
    call = service.stub.StreamingRecognize(requests, metadata=service.auth.get_auth_metadata())
    num_results = 0
    try:
        for response in call:
            num_results += len(response.results)
            if num_results >= args.get("after", 1):
                call.cancel()
    except grpc.RpcError as exc:
        return {"num_results": num_results, **_error(exc)}
    return {"num_results": num_results}


def config(args: dict) -> dict:
    response = _service(args).stub.GetRivaSpeechRecognitionConfig(
        riva.client.proto.riva_asr_pb2.RivaSpeechRecognitionConfigRequest(),
        metadata=_service(args).auth.get_auth_metadata())
    return {"models": [{"model_name": c.model_name, "parameters": dict(c.parameters)} for c in response.model_config]}


def _error(exc: grpc.RpcError) -> dict:
    return {"error": {"code": exc.code().name, "details": exc.details()}}


COMMANDS = {"recognize": recognize, "stream": stream, "streams": streams, "cancel": cancel, "config": config}

if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    try:
        answer = COMMANDS[request["command"]](request)
    except grpc.RpcError as exc:
        answer = _error(exc)
    print(json.dumps(answer))
