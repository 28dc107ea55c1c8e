"""Fixtures for tests in every folder."""

import pytest


@pytest.fixture
def blobs_apart(monkeypatch):
    """Commits and run.json write every blob as an object of its own, as a fragment over
    records.INLINE_BYTES does: for tests of what happens to blobs (garbage, a blob gone) on models small
    enough to travel inline."""
    from slowlink.protocol import records

    monkeypatch.setattr(records, "INLINE_BYTES", -1)
