"""Screenshot hal-audit's HTML report with headless Chromium at 1400 px.

    python benchmarks/screenshot_reports.py [--out reports/screenshots] [--target examples/cuda_train.py]
           [--device mlu] [--height 2400] [--html PAGE.html ...]

Runs ``hal-audit TARGET --device DEVICE --fix --out DIR/audit-out`` (a real audit in a subprocess;
``--html`` skips it and shoots the given pages instead, e.g. the matrix HTML), then
``chromium --headless --screenshot --window-size=1400,HEIGHT file://PAGE`` for each page and
writes ``DIR/<page name>-1400.png``. Chromium comes from the system (Debian: ``apt-get install -y
chromium``); the script says so and exits 2 when none is found. The page loads nothing from the
network (self-contained HTML), so the picture is what a user sees offline.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def shoot(browser: str, page: pathlib.Path, png: pathlib.Path, width: int = 1400, height: int = 2400) -> None:
    """One screenshot of ``page`` at ``width`` x ``height`` CSS pixels into ``png``."""
    with tempfile.TemporaryDirectory(prefix="hal-shot-") as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={png}",
               page.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not png.is_file():
        raise SystemExit(f"screenshot_reports: {browser} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "screenshots"))
    ap.add_argument("--target", default=str(ROOT / "examples" / "cuda_train.py"))
    ap.add_argument("--device", default="mlu")
    ap.add_argument("--height", type=int, default=2400)
    ap.add_argument("--html", nargs="*", default=None, help="shoot these pages instead of running an audit")
    ap.add_argument("--section", metavar="ID", help="shoot only the page's header and <section id=ID> (a copy of "
                    "the page with the other sections left out), as <page>-<ID>-1400.png")
    args = ap.parse_args(argv)
    browser = find_browser()
    if browser is None:
        print("screenshot_reports: no Chromium found (Debian: apt-get install -y chromium)", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pages = [pathlib.Path(p) for p in args.html] if args.html else []
    if not pages:
        audit_out = out / "audit-out"
        exe = pathlib.Path(sys.executable).parent / "hal-audit"
        proc = subprocess.run([str(exe), args.target, "--device", args.device, "--fix", "--steps", "5",
                               "--out", str(audit_out)], capture_output=True, text=True, timeout=600)
        if proc.returncode not in (0, 1):
            print(f"screenshot_reports: hal-audit exited {proc.returncode}: {proc.stderr.strip()[-500:]}",
                  file=sys.stderr)
            return 3
        pages = [audit_out / "audit.html"]
    for page in pages:
        png = out / f"{page.stem}{'-' + args.section if args.section else ''}-1400.png"
        with tempfile.TemporaryDirectory(prefix="hal-section-") as tmp:
            if args.section:
                page = only_section(page, args.section, pathlib.Path(tmp))
            shoot(browser, page, png, 1400, args.height)
        print(f"{png} ({png.stat().st_size} bytes)")
    return 0


def only_section(page: pathlib.Path, section: str, tmp: pathlib.Path) -> pathlib.Path:
    """A copy of ``page`` in ``tmp`` that keeps everything before its first ``<section`` (the header and
    the navigation) and ``<section id=SECTION>``; SystemExit naming the section when it is absent."""
    html = page.read_text(encoding="utf-8")
    start = html.find(f'<section id="{section}">')
    if start < 0:
        raise SystemExit(f"screenshot_reports: {page} has no <section id=\"{section}\">")
    end = html.index("</section>", start) + len("</section>")
    copy = tmp / page.name
    copy.write_text(html[:html.index("<section")] + html[start:end] + "\n</body></html>\n", encoding="utf-8")
    return copy


if __name__ == "__main__":
    sys.exit(main())
