"""Every figure on a measurement page has its raw data committed (issue 54): a page of the
tuner's, the emulated cluster's, the loss studies', the model's or the serving study's
either links a data file under docs/measurements/data/ that git tracks and names the
`--from-data` command that regenerates its tables, or says its raw data is gone. Any page's
link into data/ must point at a tracked file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PAGES = REPO_ROOT / "docs" / "measurements"
DATA = PAGES / "data"
# the pages held to it: their names say which study they report
STUDY_WORDS = ("tune", "emulated", "loss", "flover", "perfmodel", "guard", "heldout")
GONE = "Raw data gone"
LINK = re.compile(r"\]\((data/[^)\s]*)\)")  # a markdown link into data/, relative to the page
NAMED = re.compile(r"--from-data\s+(docs/measurements/data/\S+?)[`\s]")  # a command's file


def tracked_data() -> set[str]:
    """Paths under docs/measurements/data/ that git tracks (relative to the repo); on a copy
    that is not a git checkout, the files there."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "docs/measurements/data"],
                             cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {str(p.relative_to(REPO_ROOT)) for p in DATA.rglob("*") if p.is_file()}
    return set(filter(None, out.split("\0")))


def missing_links(text: str, tracked: set[str]) -> list[str]:
    """The data paths a page names (its links and its --from-data commands' files) that git
    does not track; a link to a folder needs a tracked file in it."""
    named = [f"docs/measurements/{m}" for m in LINK.findall(text)] + NAMED.findall(text + " ")
    bad = []
    for path in named:
        path = path.rstrip("/")
        if path not in tracked and not any(t.startswith(path + "/") for t in tracked):
            bad.append(path)
    return bad


def verdict(text: str, tracked: set[str]) -> str | None:
    """None when a study's page is held to its word; else what it lacks."""
    if GONE in text:
        return None
    if not LINK.search(text):
        return f"no link to a data file under data/ and no '{GONE}' note"
    if "--from-data" not in text:
        return "links data but names no --from-data command that regenerates its tables"
    return None


def study_pages() -> list[Path]:
    return [p for p in sorted(PAGES.glob("*.md")) if any(w in p.stem for w in STUDY_WORDS)]


def test_the_study_pages_are_found():
    names = {p.name for p in study_pages()}
    assert {"2026-12-06-tune-emulated.md", "2026-12-04-loss-rate-map.md",
            "2026-12-04-flover.md", "2026-11-30-perfmodel-validation.md"} <= names


@pytest.mark.parametrize("page", study_pages(), ids=lambda p: p.stem)
def test_a_study_page_has_its_data_and_command_or_says_they_are_gone(page):
    tracked = tracked_data()
    text = page.read_text()
    assert verdict(text, tracked) is None, f"{page.name}: {verdict(text, tracked)}"


@pytest.mark.parametrize("page", sorted(PAGES.glob("*.md")), ids=lambda p: p.stem)
def test_every_data_file_a_page_names_is_tracked(page):
    assert missing_links(page.read_text(), tracked_data()) == [], page.name


def test_the_checks_catch_a_page_without_data_and_a_link_to_an_untracked_file():
    tracked = {"docs/measurements/data/a.runs.jsonl", "docs/measurements/data/d/x.json"}
    assert "no link" in verdict("| a | table |", tracked)
    assert "--from-data" in verdict("[rows](data/a.runs.jsonl)", tracked)
    assert verdict("[rows](data/a.runs.jsonl) `s.py --from-data docs/measurements/data/"
                   "a.runs.jsonl`", tracked) is None
    assert verdict(f"> **{GONE}.** only read", tracked) is None
    assert missing_links("[rows](data/b.runs.jsonl) [d](data/d/)", tracked) == \
        ["docs/measurements/data/b.runs.jsonl"]
    assert missing_links("`s.py --from-data docs/measurements/data/c.csv`", tracked) == \
        ["docs/measurements/data/c.csv"]


# issue 54, item 7: the Lassen pick's gain over naive (+189 % and the like) is ZFP's codec
# speed as the Lassen profile prices it, not compression; a page that quotes it says so
LASSEN_GAIN = re.compile(r"naive[^+]{0,40}\+(?:[1-9]\d\d)(?:\.\d)? ?%|"
                         r"\+(?:[1-9]\d\d)(?:\.\d)? ?% over naive", re.S)
REASON = ("4.5 GB/s", "200 GB/s")


def quotes_lassen_gain(text: str) -> bool:
    return "Lassen" in text and bool(LASSEN_GAIN.search(text))


@pytest.mark.parametrize("page", [REPO_ROOT / "docs" / "tune.md", *sorted(PAGES.glob("*.md"))],
                         ids=lambda p: p.stem)
def test_a_page_quoting_the_lassen_picks_gain_over_naive_gives_the_reason(page):
    text = page.read_text()
    if quotes_lassen_gain(text):
        assert all(r in text for r in REASON), f"{page.name}: no ZFP 4.5 / int8 200 GB/s reason"


def test_the_lassen_gain_is_found_where_quoted():
    assert quotes_lassen_gain("Lassen: gain over none +0.6 %, naive\n+188.9 %, zhybrid")
    assert quotes_lassen_gain("Lassen | naive | 260.7 s | +189.3 % |")
    assert quotes_lassen_gain("Lassen: +188.9 % over naive")
    assert not quotes_lassen_gain("Lassen: naive -65.0 %, ZHybrid -42.7 %")
    assert not quotes_lassen_gain("naive +188.9 % on the emulated cluster")
