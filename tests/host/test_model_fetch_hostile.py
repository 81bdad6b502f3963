"""Issue 22, model fetch: every hostile download of tests/helpers/hostile_fetch.py is refused
with its cause or handled right (no traceback, no hang, no pin of bytes that are not the file),
and the mechanisms behind that, one by one: If-Range on a resume, a start over for a part the
server does not continue, the GGUF layout against the gguf package's own reader."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import gguf as gguf_py
import pytest
from rocky_selftest import gguf

from tests.helpers import adversary
from tests.helpers.fetch_server import RawServer
from tests.helpers.gguf_files import HOSTILE_HEADERS, OTHER, PAYLOAD, valid_variants
from tests.helpers.hostile_fetch import NAME, fetch, file_server, plain, sha

CASES = adversary.area_cases("model-fetch")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_download_is_refused_or_held(case):
    adversary.assert_good(case)


def test_a_cut_download_resumes_with_if_range_and_the_saved_length(tmp_path):
    half = len(PAYLOAD) // 2
    script = file_server(lambda n: PAYLOAD, cut=lambda n: half if n == 1 else None)
    with RawServer(script) as srv:
        run = fetch(tmp_path, srv.url)
    assert run.rc == 0, run.err
    assert (tmp_path / "models" / NAME).read_bytes() == PAYLOAD
    first, second = srv.requests
    assert "range" not in first.headers
    # Resumed from what reached the .part, asking for the same file by its ETag.
    offset = int(second.headers["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < offset <= half and second.headers["if-range"] == '"v1"'
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [NAME]  # no .part(.json)


def test_a_changed_file_is_downloaded_whole_not_spliced(tmp_path):
    # The server ignores If-Range and sends the new file's rest with its new ETag.
    script = file_server(
        lambda n: PAYLOAD if n == 1 else OTHER,
        etag=lambda n: '"v1"' if n == 1 else '"v2"',
        cut=lambda n: len(PAYLOAD) // 2 if n == 1 else None,
        honour_if_range=False,
    )
    with RawServer(script) as srv:
        run = fetch(tmp_path, srv.url)
    assert run.rc == 0, run.err
    assert "changed since the saved part" in run.err and "starting over" in run.err
    assert (tmp_path / "models" / NAME).read_bytes() == OTHER
    assert [r.headers.get("range") is not None for r in srv.requests] == [False, True, False]
    assert f"sha256: {sha(OTHER)}".encode() in run.after


def test_416_for_a_stale_longer_part_starts_over_instead_of_pinning_it(tmp_path):
    def stale(config: Path, dest: Path) -> None:
        dest.mkdir()
        (dest / (NAME + ".part")).write_bytes(OTHER + b"x" * 4096)
        url = srv.url
        state = {"url_sha256": sha(url.encode()), "kind": "etag", "validator": '"v1"'}
        (dest / (NAME + ".part.json")).write_text(json.dumps({**state, "total": 1 << 30}))

    with RawServer(plain(PAYLOAD)) as srv:
        run = fetch(tmp_path, srv.url, setup=stale)
    assert run.rc == 0, run.err
    assert "nothing past byte" in run.err and "starting over" in run.err
    assert (tmp_path / "models" / NAME).read_bytes() == PAYLOAD
    assert f"sha256: {sha(PAYLOAD)}".encode() in run.after


def test_a_dripped_status_line_ends_at_max_time(tmp_path):
    def drip(n, req, srv):
        end = time.monotonic() + 3.0
        for byte in b"HTTP/1.1 200 OK\r\n":
            if time.monotonic() > end or not srv.send(bytes([byte])):
                return
            time.sleep(0.3)

    with RawServer(drip) as srv:
        t0 = time.monotonic()
        run = fetch(tmp_path, srv.url, "--read-timeout", "60", max_time=1.0)
    assert time.monotonic() - t0 < 2.5
    assert run.rc == 2 and "gave up after --max-time 1 s" in run.err


@pytest.mark.parametrize("label", sorted(valid_variants()))
def test_layout_agrees_with_the_gguf_package(label):
    data = valid_variants()[label]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(data)
        layout = gguf.layout(str(path))
        if label != "last-tensor-unpadded":  # gguf-py cannot read a file without that padding
            reader = gguf_py.GGUFReader(str(path))
            assert layout.data_offset == reader.data_offset
            assert layout.tensors == len(reader.tensors)
            ends = [t.data_offset + t.n_bytes for t in reader.tensors]
            assert layout.data_end == max(ends)
    assert layout.complete(len(data))
    assert not layout.complete(len(data) + 1) and not layout.complete(layout.data_end - 1)


def test_every_hostile_header_is_refused_or_sized_fast(tmp_path):
    t0 = time.monotonic()
    for label, data in HOSTILE_HEADERS.items():
        path = tmp_path / f"{label}.gguf"
        path.write_bytes(data)
        try:
            layout = gguf.layout(str(path))
        except gguf.GgufError:
            continue
        assert not layout.complete(len(data)), label
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize(
    ("current", "location", "refused"),
    [
        ("https://a.example/m.gguf", "http://b.example/m.gguf", "from https to plain http"),
        ("https://a.example/m.gguf", "//b.example/m.gguf", None),  # stays https
        ("http://a.example/m.gguf", "https://b.example/m.gguf", None),
        ("https://a.example/m.gguf", "/other.gguf", None),
        ("https://a.example/m.gguf", "https://u:pw@b.example/m.gguf", "user name or password"),
        ("https://a.example/m.gguf", "file:///etc/passwd", "http\\(s\\) redirects only"),
        ("https://a.example/m.gguf", "https://[::1/m.gguf", "unusable Location"),
    ],
)
def test_redirect_targets(current, location, refused):
    # No TLS server here: the https -> http rule is checked on the function that decides it.
    from rocky_vulkan.host.download import DownloadError, _redirect_target

    if refused is None:
        assert _redirect_target(current, location, current, "model").startswith("http")
    else:
        with pytest.raises(DownloadError, match=refused) as err:
            _redirect_target(current, location, current, "model")
        assert "pw" not in str(err.value)
