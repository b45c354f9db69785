"""Screenshot pages of the built documentation site with headless Chromium, as a reader sees them.

    python tools/docs_screenshots.py [SITE_DIR] [OUT_DIR]

Serves ``SITE_DIR`` (default ``site``, what ``make docs`` builds) on 127.0.0.1 at a free
port, takes a 1280x1600 screenshot of the front page, the install page, the launcher page and
an API reference page into
``OUT_DIR`` (default ``site/screenshots``), and fails unless each is a PNG of that size
with more than one colour in it (a blank or error page is one colour). ``make docs-screenshots``
runs it after the strict build (``make docs``).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import zlib

PAGES = {"front_page": "", "install": "install/", "launcher": "launcher/", "api_checkpoints": "reference/checkpoints/"}
WIDTH, HEIGHT = 1280, 1600
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        """Requests are not news: only failures are reported."""


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit(f"no headless Chromium on PATH (looked for {', '.join(BROWSERS)}); "
                     "apt-get install -y chromium-headless-shell")


def _png_size_and_colours(path: str) -> tuple[int, int, int]:
    """Width, height and a lower bound of the number of distinct pixel bytes (decodes the IDAT stream)."""
    with open(path, "rb") as handle:
        data = handle.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path} is not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)[:1_000_000]))


def main() -> None:
    site = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "site")
    out = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(site, "screenshots"))
    if not os.path.isfile(os.path.join(site, "index.html")):
        raise SystemExit(f"{site} has no index.html: run `make docs` first")
    os.makedirs(out, exist_ok=True)
    handler = functools.partial(_QuietHandler, directory=site)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = _browser()
    try:
        with tempfile.TemporaryDirectory() as profile:
            for name, page in PAGES.items():
                target = os.path.join(out, f"{name}.png")
                url = f"http://127.0.0.1:{server.server_address[1]}/{page}"
                subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}",
                                f"--screenshot={target}", url],
                               check=True, capture_output=True, timeout=120)
                width, height, colours = _png_size_and_colours(target)
                if (width, height) != (WIDTH, HEIGHT) or colours < 2:
                    raise SystemExit(f"{target}: {width}x{height}, {colours} colour(s): not a rendered page")
                print(f"{url} -> {target} ({width}x{height})")
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
