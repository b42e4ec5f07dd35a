"""``ckpt-trace report``: a self-contained HTML page, rendered by a real headless Chromium, built from aggregates
whose figures are checked against fio's own log and the files on disk."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
from conftest import _missing, cli

from ckpt_trace.analysis.profile import profile_file
from ckpt_trace.formats import read_trace

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "traces" / "golden"
GOLDEN_DCP = GOLDEN / "v1-dcp-gpt2-tiny-2ranks-bcc.arrow"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FIGURES = [
    "Latency distribution",
    "Request sizes",
    "Offset versus time",
    "Heat map",
    "Throughput over time",
    "I/O time per rank",
    "Timeline",
]

# Injected into a copy of the page: every pair of text-bearing elements whose boxes intersect (neither inside
# the other), and every table cell whose text overflows its box. Written to <body> once the images decoded.
LAYOUT_CHECK = """<script>
window.addEventListener("load", function () {
  var els = Array.prototype.slice.call(document.querySelectorAll("h1,h2,h3,h4,p,th,td,img,nav a,code"));
  var boxes = els.map(function (e) { return e.getBoundingClientRect(); });
  var problems = [];
  for (var i = 0; i < els.length; i++) {
    var a = boxes[i];
    if (a.width === 0 || a.height === 0) continue;
    if ((els[i].tagName === "TD" || els[i].tagName === "TH") && els[i].scrollWidth > els[i].clientWidth + 1)
      problems.push("overflow: " + els[i].textContent.slice(0, 40));
    for (var j = i + 1; j < els.length; j++) {
      if (els[i].contains(els[j]) || els[j].contains(els[i])) continue;
      var b = boxes[j];
      var w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      var h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 1 && h > 1) problems.push(els[i].tagName + " '" + els[i].textContent.slice(0, 30) + "' overlaps " +
                                        els[j].tagName + " '" + els[j].textContent.slice(0, 30) + "'");
    }
  }
  document.body.setAttribute("data-layout-problems", String(problems.length));
  document.body.setAttribute("data-layout-first", problems.length ? problems[0] : "");
});
</script>"""


@pytest.fixture
def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    _missing("no Chromium to render the report (apt-get install chromium)", required_in_ci=True)


def _render(chromium: str, page: Path, tmp_path: Path, width: int = 1200) -> dict[str, str]:
    """The <body> attributes after a headless Chromium loaded ``page`` with the layout check injected."""
    checked = tmp_path / f"checked-{width}.html"
    checked.write_text(page.read_text().replace("</body>", LAYOUT_CHECK + "</body>"))
    dom = subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={width},2000",
            "--virtual-time-budget=10000",
            "--dump-dom",
            checked.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stderr[-2000:]
    return dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))


@pytest.fixture
def report_page(tmp_path, io_uring) -> Path:
    results = tmp_path / "results.json"
    cli("replay", str(GOLDEN_DCP), "--target", str(tmp_path / "replay"), "--strategy", "all", "-o", str(results))
    page = tmp_path / "report.html"
    data = json.loads(
        cli("report", str(GOLDEN_DCP), str(results), "-o", str(page), "--fio-limit", "2100", "--json").stdout
    )
    assert data["bytes"] == page.stat().st_size  # bytes of the file, not characters of the text
    return page


def test_report_is_one_self_contained_page_in_the_data_order(report_page):
    text = report_page.read_text()
    images = re.findall(r"<img alt='([^']+)' src='([^']+)'", text)
    assert [alt for alt, _ in images] == FIGURES + ["Strategy comparison"]
    assert all(src.startswith("data:image/png;base64,") for _, src in images)
    assert not re.search(r"(src|href)=['\"]https?:", text)  # nothing fetched from elsewhere
    sections = re.findall(r"<h2 id='?\"?(\w+)", text)
    assert sections == ["job", "calls", "ranks", "storage", "recommendation"]
    for strategy in ("posix", "uring-buffered", "uring-direct", "aggregated"):
        assert f"<td>{strategy}</td>" in text
    assert "<th>rows</th><td>817</td>" in text  # the golden trace's row count
    assert "<th>results</th>" not in text  # one results file: no empty column naming it
    assert "<th>host / kernel / arch</th><td>vm / 6.18" in text and "ext4, 4096 B blocks" in text
    assert re.search(r"<th>I/O window</th><td>[^<]+ after recording began; every time axis starts there", text)
    assert "What <code>ckpt-trace emit</code> would choose" in text
    assert re.search(r"<p>Replayed on [^<]+, kernel [^<]+; not --durable", text)  # where the storage was measured


def test_report_renders_in_headless_chromium_without_overlaps(report_page, chromium, tmp_path):
    for width in (1200, 800):
        body = _render(chromium, report_page, tmp_path, width)
        assert body["data-images-ok"] == body["data-images-total"] == str(len(FIGURES) + 1)
        assert body["data-layout-problems"] == "0", body["data-layout-first"]
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--window-size=1200,2400",
            f"--screenshot={shot}",
            report_page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_layout_check_finds_overlapping_text(chromium, tmp_path):
    """The check above can fail: two table cells pushed onto each other, and a cell whose text overflows."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><table><tr><td>first cell</td></tr></table>"
        "<p style='position:relative; top:-1.4em'>a paragraph over the cell</p>"
        "<table style='table-layout:fixed; width:40px'><tr><td style='overflow:hidden'>"
        "averyveryverylongwordthatcannotwrap</td></tr></table></body></html>"
    )
    body = _render(chromium, page, tmp_path)
    assert int(body["data-layout-problems"]) >= 2, body


def _iolog_pattern(iolog: Path) -> tuple[int, int, int]:
    """(writes, sequential, consecutive) from fio's own --write_iolog, counted the way Darshan counts."""
    writes = sequential = consecutive = 0
    last_end = None
    for line in iolog.read_text().splitlines():
        fields = line.split()
        if len(fields) == 5 and fields[2] == "write":
            offset, length = int(fields[3]), int(fields[4])
            writes += 1
            if last_end is not None:
                sequential += offset >= last_end
                consecutive += offset == last_end
            last_end = offset + length
    return writes, sequential, consecutive


def test_access_pattern_matches_fios_own_log():
    profile = profile_file(GOLDEN / "v2-requests-bcc.arrow")
    files = {Path(f["path"]).name: f for f in profile["files"]}
    for name, iolog in (("uring.0.0", "uring"), ("libaio.0.0", "libaio")):
        writes, sequential, consecutive = _iolog_pattern(GOLDEN / f"v2-requests-bcc.{iolog}.iolog")
        entry = files[name]
        assert (entry["data_ops"], entry["sequential"], entry["consecutive"]) == (writes, sequential, consecutive)
    uring = files["uring.0.0"]
    assert uring["consecutive"] < uring["sequential"] < uring["data_ops"]  # fio wrote it at random offsets


def test_ranks_files_and_time_bins_match_the_checkpoint_on_disk():
    path = GOLDEN / "v2-dcp-gpt2-tiny-2ranks-bcc.arrow"
    sizes = json.loads((GOLDEN / "v2-dcp-gpt2-tiny-2ranks-bcc.sizes.json").read_text())
    profile = profile_file(path, rank=1)
    owners = {o["label"]: o for o in profile["owners"]}
    assert sorted(owners) == ["rank 0", "rank 1"]  # the launcher's probe moved no data: not a rank row
    ck = "/tmp/ckpt-trace-golden/ck/"
    assert owners["rank 1"]["bytes_written"] == sizes[ck + "__1_0.distcp"]
    assert owners["rank 0"]["bytes_written"] == sizes[ck + "__0_0.distcp"] + sizes[ck + ".metadata"]
    files = {f["path"]: f for f in profile["files"]}
    assert files[ck + "__0_0.distcp"]["written"] == sizes[ck + "__0_0.distcp"]
    assert files[ck + ".metadata.tmp"]["written"] == sizes[ck + ".metadata"]  # written, then renamed
    summary = profile["summary"]
    assert np.asarray(profile["heat"]).sum() == summary["bytes_written"] + summary["bytes_read"]
    assert np.asarray(profile["throughput"])[0].sum() == summary["bytes_written"]
    # the window starts at the first file operation of a rank that moved data, not at the launcher's probe
    window = profile["window"]
    assert window["start_ns"] == min(o["first_ns"] for o in profile["owners"]) and window["lead_in_ns"] > 1e9
    slowest = max(profile["owners"], key=lambda o: o["io_time_ns"])
    assert profile["owner_labels"][profile["slowest"]] == slowest["label"]
    assert profile["owner_labels"][profile["chosen"]] == "rank 1"
    # timeline lanes: only threads of those ranks that touched files (not the TCPStore thread)
    table = read_trace(path).table
    file_tids = set(table.filter(pc.starts_with(pc.fill_null(table["path"].cast("string"), ""), ck))["tid"].to_pylist())
    bars = np.asarray(profile["timelines"])
    assert len(bars) and set(bars[:, 1].tolist()) <= file_tids
    assert set(bars[:, 0].tolist()) <= {profile["slowest"], profile["chosen"]}
    assert bars[:, 3].min() >= 0 and (bars[:, 4] > 0).all()


def _comparable(profile: dict) -> dict:
    out = {}
    labels = profile["owner_labels"]
    for key, value in profile.items():
        if key == "timelines":
            out[key] = sorted((labels[int(row[0])], *map(int, row[1:])) for row in value)
        elif isinstance(value, np.ndarray):
            out[key] = np.round(np.asarray(value, dtype=float), 3).tolist()
        elif key == "offsets":
            out[key] = [
                {
                    k: np.round(np.asarray(x, float), 3).tolist() if isinstance(x, np.ndarray) else x
                    for k, x in entry.items()
                }
                for entry in value
            ]
        elif key in ("slowest", "chosen", "owner_labels", "owners"):
            continue  # dense ids depend on the order names were met; compared below through labels
        else:
            out[key] = value
    out["owners"] = sorted((o["label"], *(v for k, v in o.items() if k != "id")) for o in profile["owners"])
    out["picked"] = (profile["owner_labels"][profile["slowest"]], profile["owner_labels"][profile["chosen"]])
    return out


@pytest.mark.parametrize(
    "name",
    ["v2-dcp-gpt2-tiny-2ranks-bcc", "v2-requests-bcc", "v2-odd-pattern-strace", "v3-gpu-dcp-gpt2-tiny-1rank-strace"],
)
def test_profile_is_the_same_at_any_batch_size(name):
    """Batches carry state (the last end per file for the access pattern, owners, bins): any batching agrees."""
    path = GOLDEN / f"{name}.arrow"
    whole = _comparable(profile_file(path))
    for rows in (1, 7, 100):
        assert _comparable(profile_file(path, batch_rows=rows)) == whole, rows


def _tracegen():
    spec = importlib.util.spec_from_file_location("tracegen", ROOT / "benchmarks" / "tracegen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_report_of_1024_ranks_shows_the_spread_the_slowest_and_a_chosen_rank(tmp_path):
    trace = tmp_path / "big.arrow"
    _tracegen().generate(trace, 60_000, 1024)
    page = tmp_path / "r.html"
    data = json.loads(cli("report", str(trace), "-o", str(page), "--rank", "1000", "--json").stdout)
    assert data["chosen"] == "rank 1000" and data["slowest"].startswith("rank ")
    text = page.read_text()
    assert "<th>ranks and processes</th><td>1,024</td>" in text
    assert "<td>chosen</td><td>rank 1000</td>" in text or data["slowest"] == "rank 1000"
    profile = profile_file(trace, rank=1000)
    assert np.asarray(profile["heat"]).shape == (1024, profile["window"]["bins"])
    assert {int(o) for o in np.asarray(profile["timelines"])[:, 0]} <= {profile["slowest"], profile["chosen"]}


@pytest.mark.slow
def test_report_refusals(tmp_path):
    page = tmp_path / "r.html"
    page.write_text("keep me")
    proc = cli("report", str(GOLDEN_DCP), "-o", str(page), check=False)
    assert proc.returncode == 2 and "already exists" in proc.stderr and page.read_text() == "keep me"
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    proc = cli("report", str(GOLDEN_DCP), str(bad), "-o", str(tmp_path / "x.html"), check=False)
    assert proc.returncode == 2 and "missing key 'results'" in proc.stderr and "Traceback" not in proc.stderr
    proc = cli("report", str(GOLDEN_DCP), "-o", str(tmp_path / "x.html"), "--rank", "9", check=False)
    assert proc.returncode == 2 and "no rank 9 in the trace (ranks: 0-1)" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "x.html").exists()


@pytest.mark.slow
def test_summary_and_report_show_each_io_interface(tmp_path):
    golden = GOLDEN / "v2-requests-bcc.arrow"
    text = cli("summary", str(golden)).stdout
    assert "I/O interfaces" in text and all(name in text for name in ("io_uring", "libaio", "mmap"))
    data = json.loads(cli("summary", str(golden), "--json").stdout)
    assert data["interfaces"]["io_uring"]["in_flight"]["max"] == 8
    assert data["interfaces"]["libaio"]["bytes_written"] == 1 << 20
    page = tmp_path / "r.html"
    cli("report", str(golden), "-o", str(page))
    html = page.read_text()
    assert "I/O interfaces" in html and "<td>io_uring</td>" in html and "max 8" in html
    assert "pid " in html  # processes without a rank are labelled by pid


@pytest.mark.slow
def test_report_shows_the_gpu_copies(tmp_path):
    page = tmp_path / "r.html"
    cli("report", str(GOLDEN / "v3-gpu-dcp-gpt2-tiny-1rank-strace.arrow"), "-o", str(page))
    text = page.read_text()
    assert "<h2 id='gpu'>GPU copies</h2>" in text and "<a href='#gpu'>" in text
    sections = re.findall(r"<h2 id='(\w+)'", text)
    assert sections.index("gpu") < sections.index("calls")  # the copies come before the calls, as the bytes do
