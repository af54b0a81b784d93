"""The dashboard in a real browser: headless Chromium (Debian's chromium + chromium-driver)
driven by Selenium against a live cluster of real processes. A job is submitted and the page must
show it: pods bound, throughput, the queue, the shards and the binder leader, the heatmap.
The screenshot is saved under the test's tmp_path and its path printed."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.e2e.conftest import ROOT, Cluster, wait_until
from tests.e2e.test_pipeline import bound, job_yaml

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.fail("needs chromium and chromium-driver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1300"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=DriverService(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def text_of(driver: WebDriver, element_id: str) -> str:
    return str(driver.find_element(By.ID, element_id).text)


def test_dashboard_shows_the_cluster_live_after_a_job(
    make_cluster: Callable[..., Cluster], browser: WebDriver, tmp_path: Path
) -> None:
    cluster = make_cluster(schedulers=2, hollow_nodes=12, dashboard=True)
    url = cluster.component("dashboard").web_url
    wait_until(lambda: len(cluster.client.list("Node")) == 12, what="12 nodes registered")

    browser.get(url)
    # ValueError: a number not rendered yet ("–") reads as "not yet", not as a failure.
    wait = WebDriverWait(browser, 60, poll_frequency=0.2, ignored_exceptions=(ValueError,))
    wait.until(lambda d: text_of(d, "connection") == "live")
    wait.until(lambda d: text_of(d, "nodes-total") == "12")
    before = tmp_path / "dashboard-before.png"
    browser.save_screenshot(str(before))

    # A job into a queue with a quota, while the page stays open: it must update by itself.
    cluster.godel("apply", "-f", str(ROOT / "examples" / "queue.yaml"))  # queue "research"
    cluster.godel(
        "apply", "-f", "-",
        stdin=job_yaml("shown", 10, 10, "1", duration_ms=600_000, extra="  queue: research\n"),
    )  # fmt: skip
    wait_until(lambda: bound(cluster, "shown") == 10, what="all 10 pods bound")
    # And a gang that cannot fit in what is left (20 × 3 CPUs), so pods wait for a reason.
    cluster.godel("apply", "-f", "-", stdin=job_yaml("waits", 20, 20, "3"))

    wait.until(
        lambda d: int(text_of(d, "pods-bound") or 0) + int(text_of(d, "pods-running") or 0) == 10
    )
    wait.until(lambda d: d.find_element(By.ID, "throughput").get_attribute("data-total") == "10")
    wait.until(lambda d: text_of(d, "pending-reasons").splitlines()[1:] == ["insufficient cpu 20"])
    wait.until(lambda d: "research" in text_of(d, "queues") and "10" in text_of(d, "queues"))
    wait.until(
        lambda d: (
            int(d.find_element(By.ID, "heatmap-guaranteed").get_attribute("data-busy") or 0) > 0
        )
    )

    screenshot = tmp_path / "dashboard.png"
    browser.save_screenshot(str(screenshot))
    print(f"dashboard screenshots: {before} {screenshot}")

    assert text_of(browser, "nodes-ready") == "12"
    assert float(text_of(browser, "throughput-now")) >= 0
    assert text_of(browser, "latency-now") != "–"
    shards = text_of(browser, "shards")
    assert "scheduler-0" in shards and "scheduler-1" in shards
    assert text_of(browser, "binder-leader").startswith("binder-")
    # One read of the whole table: the page re-renders rows on every update, so row elements
    # found a moment earlier can be stale by the time their text is read.
    research = [
        row for row in text_of(browser, "queues").splitlines() if row.startswith("research")
    ]
    assert research and "64 / 256Gi" in research[0] and "10 / " in research[0]
    assert text_of(browser, "pods-pending") == "20"
    assert screenshot.stat().st_size > 10_000
