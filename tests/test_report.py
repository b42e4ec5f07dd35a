"""``ckpt-trace report``: a self-contained HTML page, rendered by a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import _missing, cli

GOLDEN_DCP = Path(__file__).resolve().parent.parent / "traces" / "golden" / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    _missing("no Chromium to render the report (apt-get install chromium)", required_in_ci=True)


@pytest.fixture
def report_page(tmp_path, io_uring) -> Path:
    results = tmp_path / "results.json"
    cli("replay", str(GOLDEN_DCP), "--target", str(tmp_path / "replay"), "--strategy", "all", "-o", str(results))
    page = tmp_path / "report.html"
    cli("report", str(GOLDEN_DCP), str(results), "-o", str(page), "--fio-limit", "2100")
    return page


def test_report_is_one_self_contained_page(report_page):
    text = report_page.read_text()
    images = re.findall(r"<img alt='([^']+)' src='([^']+)'", text)
    assert [alt for alt, _ in images] == ["Timeline", "Request sizes", "Offset versus time", "Throughput over time",
                                          "Strategy comparison"]
    assert all(src.startswith("data:image/png;base64,") for _, src in images)
    assert not re.search(r"(src|href)=['\"]https?:", text)  # nothing fetched from elsewhere
    for strategy in ("posix", "uring-buffered", "uring-direct", "aggregated"):
        assert f"<td>{strategy}</td>" in text
    assert "<th>rows</th><td>817</td>" in text  # the golden trace's row count, from its summary


def test_report_renders_in_headless_chromium(report_page, chromium, tmp_path):
    profile = tmp_path / "chromium-profile"
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                          "--dump-dom", report_page.as_uri()], capture_output=True, text=True, timeout=120)
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body, dom.stderr[-2000:]
    assert 'data-images-ok="5"' in body.group(0) and 'data-images-total="5"' in body.group(0)
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1200,2400",
                    f"--screenshot={shot}", report_page.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_report_refusals(tmp_path):
    page = tmp_path / "r.html"
    page.write_text("keep me")
    proc = cli("report", str(GOLDEN_DCP), "-o", str(page), check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr and page.read_text() == "keep me"
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    proc = cli("report", str(GOLDEN_DCP), str(bad), "-o", str(tmp_path / "x.html"), check=False)
    assert proc.returncode == 2 and "missing key 'results'" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.html").exists()


def test_summary_and_report_show_each_io_interface(tmp_path):
    golden = GOLDEN_DCP.parent / "v2-requests-bcc.arrow"
    text = cli("summary", str(golden)).stdout
    assert "I/O interfaces" in text and all(name in text for name in ("io_uring", "libaio", "mmap"))
    data = json.loads(cli("summary", str(golden), "--json").stdout)
    assert data["interfaces"]["io_uring"]["in_flight"]["max"] == 8
    assert data["interfaces"]["libaio"]["bytes_written"] == 1 << 20
    page = tmp_path / "r.html"
    cli("report", str(golden), "-o", str(page))
    html = page.read_text()
    assert "I/O interfaces" in html and "<td>io_uring</td>" in html and "max 8" in html
