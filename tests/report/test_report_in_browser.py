"""The HTML report in a real browser (headless Chromium) at a common laptop width."""

import re
import shutil
import subprocess

import pytest
from PIL import Image
from report_helpers import fill_with_study_runs, record_failure

from dtlab.cell import Cell
from dtlab.report import build_study_report, generate_report, write_report
from dtlab.results import ResultStore

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
LAPTOP = (1280, 800)
# Appended to a copy of the report: records how wide the page lays out, for --dump-dom to read.
PROBE = ("<script>document.body.dataset.pageWidth = document.documentElement.scrollWidth;"
         "document.body.dataset.widestImage = Math.max(...[...document.images].map(i => i.width));</script>")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (scripts/setup.sh installs "
                                "chromium-headless-shell where apt has it)")


def browser(*args: str, page) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={LAPTOP[0]},{LAPTOP[1]}", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )


def laid_out_width(html) -> tuple[int, int]:
    probe = html.with_name("probe.html")
    probe.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    dom = browser("--dump-dom", page=probe).stdout
    page = re.search(r'data-page-width="(\d+)"', dom)
    image = re.search(r'data-widest-image="(\d+)"', dom)
    assert page and image, dom[-500:]
    return int(page.group(1)), int(image.group(1))


@pytest.mark.parametrize("source", ["recorded runs", "the study alone"])
def test_report_fits_a_laptop_window(tmp_path, source):
    if source == "recorded runs":
        store = ResultStore(tmp_path / "results")
        fill_with_study_runs(store)
        # A failure whose reason holds a long path: one unbreakable word in a table cell.
        venv = "/opt/dtlab/venvs/trainer-" + "0123456789abcdef" * 6 + "/bin/python"
        record_failure(store, Cell("spark", 2, 20, 1, "study"), f"preflight: no trainer venv at {venv}")
        files = generate_report(store, tmp_path / "report")
    else:
        files = write_report(build_study_report(), tmp_path / "report")
    page_width, widest_image = laid_out_width(files.html)
    # Wide tables scroll inside their own box; the page itself never scrolls sideways.
    assert page_width <= LAPTOP[0], f"the page lays out {page_width} px wide in a {LAPTOP[0]} px window"
    assert 0 < widest_image <= LAPTOP[0]
    screenshot = tmp_path / "report.png"
    browser(f"--screenshot={screenshot}", page=files.html)
    image = Image.open(screenshot).convert("RGB")
    assert image.size == LAPTOP
    assert len(image.getcolors(1_000_000)) > 50, "the screenshot shows a rendered page, not a blank one"
