"""heap.py: the collector's policy for a command's own process, and nothing changed elsewhere."""

from __future__ import annotations

import gc

import pytest

from accel_train import heap


@pytest.fixture
def unfrozen():
    """Whatever a test freezes in this (pytest) process is thawed after it, and the collector left on."""
    yield
    gc.unfreeze()
    gc.enable()


def test_importing_changes_nothing_in_a_process_that_is_not_one_command(monkeypatch, unfrozen):
    """accel_train.train() in a notebook, called again and again: an object frozen while alive is never collected
    when it dies in a reference cycle later, so the Python API keeps the collector as it is."""
    monkeypatch.setattr(heap, "_ONE_COMMAND", False)
    before = gc.get_freeze_count()
    with heap.importing():
        assert gc.isenabled()
        import json  # noqa: F401
    assert gc.get_freeze_count() == before and gc.isenabled()


def test_importing_pauses_collections_then_freezes_what_loaded(monkeypatch, unfrozen):
    monkeypatch.setattr(heap, "_ONE_COMMAND", True)
    with heap.importing():
        assert not gc.isenabled()  # no collection walks the heap while it grows
        loaded = [object() for _ in range(1000)]
        with heap.importing():  # nested: pauses once, the outer one freezes
            assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() >= len(loaded)
    assert not any(o is loaded for o in gc.get_objects())  # frozen: the collector no longer lists (walks) it


def test_importing_that_fails_switches_the_collector_back_on_without_a_freeze(monkeypatch, unfrozen):
    monkeypatch.setattr(heap, "_ONE_COMMAND", True)
    gc.unfreeze()
    with pytest.raises(ImportError), heap.importing():
        raise ImportError("no such module")
    assert gc.isenabled() and gc.get_freeze_count() == 0
