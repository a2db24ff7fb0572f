"""Look at a report as a person would: render it with headless Chromium to a PNG screenshot.

Used by the browser test (the page renders, with no console message, into a picture that is not
blank) and to make the README's screenshots::

    python -m tokennet.viz.report.browser RUN_DIR/report.html shot.png [--docs]

Chromium is found as ``chromium`` or ``chromium-browser`` (Debian: ``apt-get install chromium``), or
given with ``$CHROMIUM``. The page has no script, so any console message is a problem worth seeing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["find_chromium", "new_profile", "remove_profile", "screenshot", "crop_background"]


def find_chromium() -> str | None:
    """The Chromium executable, or None when it is not installed."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if shutil.which(env) else None
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def new_profile() -> str:
    """A fresh, empty Chromium profile directory (``--user-data-dir``); :func:`remove_profile` removes it."""
    return tempfile.mkdtemp(prefix="tokennet-chromium-")


def remove_profile(path: str | Path, *, tries: int = 20, wait: float = 0.1) -> bool:
    """Remove a Chromium profile directory; whether it is gone. Chromium's helper processes can outlive the browser
    by a moment and still write into the profile, so one removal can fail ("Directory not empty"): try again a
    little later, up to ``tries`` times, then leave it (a temporary directory left behind harms nothing)."""
    for attempt in range(tries):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return True
        if attempt + 1 < tries:
            time.sleep(wait)
    return False


def screenshot(html: str | Path, png: str | Path, *, width: int = 1280, height: int = 9000,
               timeout: float = 120.0) -> list[str]:
    """Render ``html`` to ``png`` (``width`` × ``height`` px, the empty bottom cropped); return the page's
    console messages (Chromium's ``CONSOLE`` log lines).

    Raises ``FileNotFoundError`` when Chromium is missing and ``RuntimeError`` when it fails.
    """
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
    html, png = Path(html).resolve(), Path(png).resolve()
    profile = new_profile()
    try:
        cmd = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--disable-extensions", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
               f"--window-size={width},{height}", f"--screenshot={png}", html.as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        remove_profile(profile)
    if proc.returncode != 0 or not png.is_file():
        raise RuntimeError(f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}")
    crop_background(png)
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]


def crop_background(png: str | Path, margin: int = 24) -> None:
    """Cut the rows below the page's content (the uniform background colour) off a screenshot."""
    from PIL import Image, ImageChops

    image = Image.open(png).convert("RGB")
    background = Image.new("RGB", image.size, image.getpixel((image.width - 1, image.height - 1)))
    box = ImageChops.difference(image, background).getbbox()
    if box is not None:
        image.crop((0, 0, image.width, min(image.height, box[3] + margin))).save(png)


def docs_image(png: str | Path, *, top: int = 2600, width: int = 760) -> None:
    """Shrink a screenshot for the README: its first ``top`` px, ``width`` px wide, 256 colours (< 200 KB)."""
    from PIL import Image

    image = Image.open(png).convert("RGB")
    image = image.crop((0, 0, image.width, min(image.height, top)))
    image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    image.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(png, optimize=True)  # keeps saturated colours


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokennet.viz.report.browser",
                                description="Render an HTML report to a PNG with headless Chromium.")
    parser.add_argument("html")
    parser.add_argument("png")
    parser.add_argument("--docs", action="store_true", help="shrink it for the README (top of the page, < 200 KB)")
    args = parser.parse_args(argv)
    messages = screenshot(args.html, args.png)
    if args.docs:
        docs_image(args.png)
    for message in messages:
        print(message)
    print(f"{args.png}: {Path(args.png).stat().st_size // 1024} KB, {len(messages)} console message(s)")
    return 1 if messages else 0


if __name__ == "__main__":
    raise SystemExit(main())
