"""scripts/setup.sh installs every extra setup.cfg declares and what the README's test command needs
(espeak-ng), and README.md and docs/INSTALL.md name the same extras as setup.sh."""
from __future__ import annotations

import configparser
import re

from support import ROOT


def extras_named(text: str) -> list[set[str]]:
    """Each ``.[a,b,c]`` extras list in ``text``."""
    return [set(m.split(",")) for m in re.findall(r"\.\[([\w,-]+)\]", text)]


def test_setup_installs_every_extra_and_the_docs_say_so():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    declared = set(cfg["options.extras_require"])
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert extras_named(setup) == [declared]
    for doc in ("README.md", "docs/INSTALL.md"):
        named = extras_named((ROOT / doc).read_text(encoding="utf-8"))
        assert named and named[0] == declared, f"{doc} lists the extras {named[:1]}, setup.cfg declares {declared}"


def test_setup_installs_espeak_ng_and_chromium_or_says_how():
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    for package in ("espeak-ng", "chromium"):  # the ASR/Piper sentences; the page test's browser
        assert f"command -v {package} >/dev/null || missing+=({package})" in setup, package
    assert 'apt-get install -y -qq "${missing[@]}"' in setup and "sudo apt-get install -y ${missing[*]}" in setup
    # the browser (and its Debian packages) only with --browser, which CI passes so that its page tests run
    browser = setup.index("missing+=(chromium)")
    assert setup.rindex('if [ "$BROWSER" = 1 ]; then', 0, browser) > setup.index("missing+=(espeak-ng)")
    assert 'stage "setup" bash scripts/setup.sh --browser' in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
