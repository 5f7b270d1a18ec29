"""Reading a multipart upload within the size limit and the body timeout, and waiting for its client to leave."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request

from oasr.serving.protocol import LIST_FIELDS, APIError

MIB = 1 << 20
_MAX_FIELDS = 32  # a transcription form has fewer than ten; this only bounds what a hostile client sends
_MAX_FIELD_BYTES = 64 * 1024  # one text field (a prompt is at most a few hundred tokens)


class ClientGone(Exception):
    """The client disconnected before its answer was ready; nothing is sent back."""


def too_large(limit: int) -> APIError:
    return APIError(413, f"Maximum upload size exceeded: the request body is larger than {limit / MIB:g} MB.",
                    param="file", code="file_too_large")


def body_timeout(timeout_s: float) -> APIError:
    # The rest of the body is never read: the connection closes with the answer.
    return APIError(408, f"The request body was not received within {timeout_s:g} s; send the whole upload "
                    "without pausing.", code="body_timeout", headers={"Connection": "close"})


async def _body(request: Request, limit: int, timeout_s: float) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive, until ``limit`` bytes or ``timeout_s`` seconds from now. A deadline for
    the whole body, not for each chunk: a client sending a byte now and then must not keep it open."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    received = 0
    while True:
        try:
            message = await asyncio.wait_for(request.receive(), deadline - loop.time())
        except TimeoutError:
            raise body_timeout(timeout_s) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise too_large(limit)
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def read_form(request: Request, limit: int, timeout_s: float) -> FormData:
    """The request's whole multipart form, refusing bodies over ``limit`` bytes (at once when Content-Length
    says so, else as soon as that many bytes have arrived, so a chunked upload cannot grow without bound) and
    bodies not received within ``timeout_s`` seconds (408)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise APIError(400, "Expected a multipart/form-data request body with a 'file' field.")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    parser = MultiPartParser(request.headers, _body(request, limit, timeout_s), max_files=1,
                             max_fields=_MAX_FIELDS, max_part_size=_MAX_FIELD_BYTES)
    try:
        return await parser.parse()
    except MultiPartException as exc:
        raise APIError(400, f"Malformed multipart body: {exc.message}") from None
    except ClientDisconnect:
        raise ClientGone() from None


def split_form(form: FormData) -> tuple[UploadFile, dict[str, object]]:
    """The uploaded ``file`` and the other fields (``name[]`` fields gathered into lists under ``name``)."""
    upload: UploadFile | None = None
    fields: dict[str, object] = {}
    for key, value in form.multi_items():
        if key == "file":
            if not isinstance(value, UploadFile):
                raise APIError(400, "'file' must be an uploaded file (multipart part with a filename), not text.",
                               param="file")
            upload = value
            continue
        name = key.removesuffix("[]")
        if name in LIST_FIELDS:
            fields.setdefault(name, []).append(value)  # type: ignore[union-attr]
        elif name in fields:
            raise APIError(400, f"Parameter '{name}' was given more than once.", param=name)
        else:
            fields[name] = value
    if upload is None:
        raise APIError(400, "Missing required parameter: 'file'.", param="file")
    return upload, fields


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so ``receive`` only waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
