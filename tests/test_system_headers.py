"""Every shipped system file's header says where its numbers come from (issue: "each file's
header says, field by field, measured, fitted, shared, or from specs"): a provenance statement
for its kernel fields, the specification it takes its peaks from, and, for a file with
sustained clocks, where those readings come from."""

from __future__ import annotations

import re

import pytest

from conftest import SYSTEMS_DIR
from costmodel.inputs.load import load_system

FILES = sorted(p.name for p in SYSTEMS_DIR.glob("*.yaml"))
PROVENANCE = ("GENERATED FILE", "FITTED ON PUBLISHED", "UNCALIBRATED", "calibration of this project",
              "CALIBRATION STATUS")
SPECIFICATIONS = ("datasheet", "product page", "whitepaper")
CITATION = re.compile(r"(PR #\d+|issue #\d+|arXiv \d{4}\.\d{4,5}|[\w./-]+\.(?:md|py|h|ya?ml|json)\b|datasheet)")


def header(name: str) -> str:
    return (SYSTEMS_DIR / name).read_text().split("\nname:")[0]


@pytest.mark.parametrize("name", FILES)
def test_each_header_says_where_its_kernel_fields_and_peaks_come_from(name):
    text = header(name)
    assert any(p in text for p in PROVENANCE), f"{name}: no provenance statement ({' / '.join(PROVENANCE)})"
    assert any(s in text for s in SPECIFICATIONS), f"{name}: names no specification for its peaks"


@pytest.mark.parametrize("name", FILES)
def test_a_file_with_sustained_clocks_cites_their_source(name):
    system = load_system(SYSTEMS_DIR / name)
    if system.clocks is None:
        return
    assert "`clocks`" in header(name) or "clocks.sustained_mhz" in header(name), name
    assert CITATION.search(system.clocks.source), f"{name}: clocks.source cites nothing: {system.clocks.source!r}"



@pytest.mark.parametrize("name", FILES)
def test_each_measured_or_fitted_field_group_cites_its_source(name):
    """Every bullet of the header that says a field group was measured, fitted or published
    names where (a PR, issue, paper, file or datasheet)."""
    bullets = header(name).split("#   * ")[1:]
    for bullet in bullets:
        if any(word in bullet.split(":")[0] for word in ("MEASURED", "FITTED", "PUBLISHED")):
            assert CITATION.search(bullet), (name, bullet[:80])
