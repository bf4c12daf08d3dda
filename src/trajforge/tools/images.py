"""Image bytes: what format they are, and a data URL for a multimodal request.

Shared by ``vision_analyze`` (which reads an image and sends it), ``image_generate`` (which
names the file it saves) and ``browser_vision``. Only the formats the OpenAI vision API accepts
are recognised, by their magic bytes: a file named ``.png`` that holds HTML is not an image.
"""

from __future__ import annotations

import base64
import binascii

# (mime type, file extension) by leading bytes; WEBP is RIFF....WEBP, checked apart.
_SIGNATURES: tuple[tuple[bytes, str, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png", "png"),
    (b"\xff\xd8\xff", "image/jpeg", "jpg"),
    (b"GIF87a", "image/gif", "gif"),
    (b"GIF89a", "image/gif", "gif"),
)

SUPPORTED = "PNG, JPEG, GIF or WEBP"


class ImageError(ValueError):
    """Bytes that are not an image we can send; the message goes to the model."""


def sniff(data: bytes) -> tuple[str, str] | None:
    """``(mime, extension)`` of an image in a supported format, else None."""
    for magic, mime, ext in _SIGNATURES:
        if data.startswith(magic):
            return mime, ext
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp", "webp"
    return None


def data_url(data: bytes, source: str) -> str:
    """``data:<mime>;base64,...`` of an image, or :class:`ImageError` naming ``source``."""
    kind = sniff(data)
    if kind is None:
        raise ImageError(f"{source} is not a {SUPPORTED} image ({len(data)} bytes)")
    return f"data:{kind[0]};base64,{base64.b64encode(data).decode()}"


def decode_data_url(url: str, max_bytes: int) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL (checked to be an image, at most ``max_bytes``)."""
    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:") or not header.endswith(";base64"):
        raise ImageError("a data URL must look like data:image/png;base64,...")
    if len(payload) * 3 // 4 > max_bytes:
        raise ImageError(f"the image is larger than the {max_bytes} bytes allowed")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the data URL's base64 payload is invalid") from None
    if sniff(data) is None:
        raise ImageError(f"the data URL does not hold a {SUPPORTED} image")
    return data
