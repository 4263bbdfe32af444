"""Regenerate the README's screenshots: every dashboard view on the ~500-token example.

.venv/bin/python docs/make_screenshots.py   # needs Debian's chromium + chromium-driver
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.keys import Keys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnviz.dashboard import create_app  # noqa: E402
from attnviz.dashboard.layout import ID, LONG_EXAMPLE, VIEWS  # noqa: E402

OUT = Path(__file__).parent


def main(port: int = 8077) -> None:
    app = create_app(default_model="smollm2")
    threading.Thread(target=lambda: app.run(port=port, debug=False), daemon=True).start()
    options = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1100"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options)
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        wait(driver, lambda: "tokens" in driver.find_element("id", ID.status).text, 120)
        shoot(driver, "tab-lab", "lab-zh", extra=lambda: click_words(driver))
        shoot(driver, "tab-coref", "coref-zh")
        box = driver.find_element("id", ID.text)
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(Keys.DELETE)
        box.send_keys(LONG_EXAMPLE)
        driver.find_element("id", ID.run).click()
        wait(
            driver,
            lambda: (
                "smollm2: 5" in driver.find_element("id", ID.status).text
                or "smollm2: 4" in driver.find_element("id", ID.status).text
            ),
            180,
        )
        print(driver.find_element("id", ID.status).text)
        for key, _ in VIEWS:
            shoot(driver, f"tab-{key}", f"view-{key}")
    finally:
        driver.quit()


def click_words(driver) -> None:
    driver.find_elements("css selector", f"#{ID.words} input")[1].click()
    time.sleep(2)


def shoot(driver, tab_value: str, name: str, extra=None) -> None:
    label = dict(VIEWS)[tab_value.removeprefix("tab-")]
    for tab in driver.find_elements("css selector", ".tab"):
        if tab.text.strip() == label:
            tab.click()
    if extra:
        extra()
    time.sleep(6)
    driver.save_screenshot(str(OUT / f"{name}.png"))
    print("wrote", OUT / f"{name}.png")


def wait(driver, condition, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if condition():
                return
        except Exception:  # noqa: BLE001 - element not there yet
            pass
        time.sleep(0.5)
    raise TimeoutError("the dashboard did not get ready")


if __name__ == "__main__":
    main()
