"""NVIDIA Riva's ASR gRPC service (``nvidia.riva.asr.RivaSpeechRecognition``) over OASR's engine: one more front
end beside the HTTP routes, on the same engine client, admission, API keys and metrics (``oasr serve
--grpc-port``). ``protos/`` holds the service definition (Riva's messages and field numbers, so Riva's own
clients work unchanged) and the Python modules generated from it (``scripts/generate_grpc.sh``)."""
