"""One image checked before vLLM sees it (runtime/edgectl_runtime/service/image_check.py), on real
bytes made by Pillow here: each bad case is a 400 whose message names the problem and the fix;
a good image passes, read whole."""

from __future__ import annotations

import io
import warnings

import pytest

pytest.importorskip("PIL")

from image_files import data_uri, encoded, photo_like, png_declaring  # noqa: E402
from PIL import Image  # noqa: E402

from edgectl_runtime.service.guarded_request import Refusal  # noqa: E402
from edgectl_runtime.service.image_check import (  # noqa: E402
    ImageSeen,
    check_image_bytes,
    check_image_url,
    data_uri_bytes,
)

MAX_PIXELS = 4096 * 4096
WHERE = "image 1 (messages[0].content[1])"


def verdict(url: object, *, allow_remote_urls: bool = False, max_pixels: int = MAX_PIXELS):
    return check_image_url(url, WHERE, max_pixels=max_pixels, allow_remote_urls=allow_remote_urls)


def refused(url: object, reason: str, *words: str, **kwargs) -> str:
    """The refusal's message, after checking its status, its reason and that it names the image and ``words``."""
    result = verdict(url, **kwargs)
    assert isinstance(result, Refusal), result
    assert (result.status, result.reason) == (400, reason), result
    assert result.message.startswith(WHERE), result.message
    for word in words:
        assert word in result.message, (word, result.message)
    return result.message


@pytest.mark.parametrize(("fmt", "media_type"), [("PNG", "image/png"), ("JPEG", "image/jpeg"),
                                                 ("WEBP", "image/webp"), ("GIF", "image/gif")])
def test_each_supported_format_passes_read_whole(fmt, media_type):
    assert verdict(data_uri(encoded(fmt), media_type)) == ImageSeen(fmt, 96, 64)


def test_the_declared_image_type_need_not_match_the_bytes():
    """vLLM reads the bytes, not the media type (connector.py: ImageMediaIO.load_base64 ignores it)."""
    assert verdict(data_uri(encoded("JPEG"), "image/png")) == ImageSeen("JPEG", 96, 64)


def test_bytes_that_are_not_an_image():
    refused(data_uri(b"%PDF-1.7\n" + b"0" * 200), "not_image", "is not an image", "b'%PDF-1.7", "PNG, JPEG, WebP or GIF")
    refused(data_uri(b"hi"), "not_image", "is not an image")  # shorter than any format's magic


@pytest.mark.parametrize(("fmt", "name"), [("PNG", "PNG"), ("JPEG", "JPEG")])
@pytest.mark.parametrize("kept", [0.25, 0.6, 0.97])
def test_a_truncated_png_or_jpeg(fmt, name, kept):
    whole = encoded(fmt)
    message = refused(data_uri(whole[: int(len(whole) * kept)]), "truncated", f"is a truncated {name}",
                      "send the whole image again")
    assert "Pillow: image file is truncated" in message


def test_a_png_cut_inside_its_header():
    refused(data_uri(encoded("PNG")[:20]), "damaged", "is a PNG whose header cannot be read", "send the whole image again")


def test_a_huge_image_is_refused_from_its_header_by_the_plans_limit_not_pillows():
    huge = png_declaring(40000, 40000)
    assert len(huge) < 200
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even Pillow's DecompressionBombWarning
        message = refused(data_uri(huge), "too_many_pixels", "40000x40000 = 1,600,000,000 pixels",
                          "limit of 16,777,216 pixels (max_pixels)", "scale it down to 4096x4096 or smaller")
    assert "decompression" not in message.lower() and Image.MAX_IMAGE_PIXELS == 89_478_485  # Pillow's untouched
    refused(data_uri(encoded("PNG", photo_like(300, 100))), "too_many_pixels", "300x100 = 30,000 pixels",
            "limit of 10,000 pixels", "to 173x57 or smaller", max_pixels=10_000)


def test_an_image_at_the_limit_passes():
    assert verdict(data_uri(encoded("PNG")), max_pixels=96 * 64) == ImageSeen("PNG", 96, 64)


@pytest.mark.parametrize(("width", "height"), [(0, 10), (10, 0), (0, 0)])
def test_a_zero_size_image(width, height):
    refused(data_uri(png_declaring(width, height)), "zero_size", f"is a PNG of {width}x{height} pixels",
            "at least one pixel each way")


def test_an_empty_image():
    refused("data:image/png;base64,", "empty", "is empty")
    assert isinstance(check_image_bytes(b"", WHERE, max_pixels=MAX_PIXELS), Refusal)


@pytest.mark.parametrize(("fmt", "name"), [("BMP", "BMP"), ("TIFF", "TIFF")])
def test_a_valid_image_of_an_unsupported_format(fmt, name):
    data = encoded(fmt)
    assert Image.open(io.BytesIO(data)).format == fmt  # a real, valid file
    refused(data_uri(data, f"image/{fmt.lower()}"), "unsupported_format", f"is a {name} image",
            "this server takes PNG, JPEG, WebP or GIF", "convert it")


@pytest.mark.parametrize(("url", "reason", "words"), [
    ("data:image/png;base64" + "iVBORw0KGgo=", "bad_data_uri", ("malformed data: URI", "no ','")),
    ("data:image/png," + "%89PNG", "bad_data_uri", ("without ';base64'",)),
    ("data:text/plain;base64,aGVsbG8=", "bad_data_uri", ("of media type 'text/plain'", "image/png")),
    ("data:;base64,aGVsbG8=", "bad_data_uri", ("with no media type",)),
    ("data:image/png;base64,not base64 at all!", "bad_base64", ("base64 data does not decode", "RFC 4648")),
    ("data:image/png;base64,iVBORw0KGgo", "bad_base64", ("does not decode",)),  # padding missing
])
def test_a_malformed_data_uri(url, reason, words):
    refused(url, reason, *words)


def test_a_remote_url_is_refused_unless_the_plan_allows_it():
    url = "https://user:secret@cameras.example.com/gate/latest.jpg?token=abc"
    message = refused(url, "remote_url", "https://cameras.example.com/", "fetches no remote images", "data: URI")
    assert "secret" not in message and "token" not in message
    assert verdict(url, allow_remote_urls=True) is None  # vLLM fetches it, and its loader checks it
    refused("http://10.0.0.7/x.png", "remote_url", "http://10.0.0.7/")


@pytest.mark.parametrize(("url", "reason"), [("file:///etc/passwd", "file_url"), ("ftp://host/x.png", "bad_url"),
                                             ("", "no_url"), (None, "no_url"), ({"url": "x"}, "no_url")])
def test_other_urls_are_refused(url, reason):
    refused(url, reason, "data: URI")
    refused(url, reason, allow_remote_urls=True)  # remote means http(s) only


def test_data_uri_bytes_reads_parameters_as_vllm_does():
    assert data_uri_bytes("data:image/png;name=x.png;base64,aGk=", WHERE) == b"hi"
    assert data_uri_bytes("DATA:IMAGE/PNG;BASE64,aGk=", WHERE) == b"hi"
