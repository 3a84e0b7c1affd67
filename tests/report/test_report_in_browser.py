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
         "document.body.dataset.viewWidth = document.documentElement.clientWidth;"
         "document.body.dataset.widestImage = Math.max(...[...document.images].map(i => i.width));"
         "const decision = document.querySelector('#decision-figure img');"
         "document.body.dataset.decision = decision ? decision.width + 'x' + decision.height : 'none';"
         "</script>")

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (scripts/setup.sh installs "
                                "chromium-headless-shell where apt has it)")


def browser(*args: str, page) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--window-size={LAPTOP[0]},{LAPTOP[1]}", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )


def laid_out(html) -> dict[str, str]:
    """How the page lays out in the window: its width, the window's, the widest image's and the decision
    figure's ("WxH", or "none")."""
    probe = html.with_name("probe.html")
    probe.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    dom = browser("--dump-dom", page=probe).stdout
    found = dict(re.findall(r'data-(page-width|view-width|widest-image|decision)="([^"]+)"', dom))
    assert len(found) == 4, dom[-500:]
    return found


def laid_out_width(html) -> tuple[int, int]:
    found = laid_out(html)
    return int(found["page-width"]), int(found["widest-image"])


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


def test_the_decision_figure_fits_the_page_after_the_verdict(tmp_path):
    """Figure B.5 at 1280 px: in the page, no wider than the page, shown at (nearly) its own size so its
    labels stay readable, and the page does not scroll sideways."""
    store = ResultStore(tmp_path / "results")
    fill_with_study_runs(store)
    files = generate_report(store, tmp_path / "report")
    found = laid_out(files.html)
    assert found["decision"] != "none", "Figure B.5 is not in the page"
    width, height = map(int, found["decision"].split("x"))
    page, view = int(found["page-width"]), int(found["view-width"])
    assert page <= view <= LAPTOP[0], f"the page lays out {page} px wide in a {view} px window"
    assert 0 < width <= view
    drawn = Image.open(tmp_path / "report" / "figures" / "figure-b.5-decision.png")
    assert width >= 0.95 * drawn.width, f"shown at {width} of its {drawn.width} px: its text shrinks"
    assert abs(height / width - drawn.height / drawn.width) < 0.01, "drawn to scale"
