"""Transcribing many files: manifests, resumable output directories (``inputs``) and Ray Data runs over many
GPUs and hosts (``ray_transcribe``, needing ``oasr[ray]``)."""
