"""RLLTE's documented defaults fitted to the CPUs a run can use."""

from __future__ import annotations

import warnings

import pytest

from rlfleet.distributed.config import fitted_defaults


def test_documented_defaults_stand_where_the_cpus_hold_them() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fitted_defaults(None, None, None, None, batch_fragments=2) == (45, 4, 60)
        assert fitted_defaults(None, None, None, 64, batch_fragments=2) == (45, 4, 60)
        # Given values stay, whatever the CPUs.
        assert fitted_defaults(8, 2, 10, 2, batch_fragments=2) == (8, 2, 10)


def test_documented_defaults_fit_fewer_cpus_with_a_warning() -> None:
    with pytest.warns(UserWarning, match="num_actors: the documented default 45 .* 16 CPUs"):
        assert fitted_defaults(None, 1, None, 16, batch_fragments=2) == (15, 1, 60)
    with pytest.warns(UserWarning, match="documented default") as caught:
        assert fitted_defaults(None, None, None, 2, batch_fragments=2) == (1, 1, 60)
    messages = [str(w.message) for w in caught]
    assert any("num_learners: the documented default 4" in m and "2 CPUs" in m for m in messages)
    assert any("num_actors" in m and "using 1" in m for m in messages)
    # Learner actors take their CPUs before the actors do.
    with pytest.warns(UserWarning, match="num_actors"):
        assert fitted_defaults(None, 2, None, 16, batch_fragments=2) == (13, 2, 60)


def test_unset_storages_cover_the_actors_and_learners() -> None:
    assert fitted_defaults(100, 1, None, None, batch_fragments=2) == (100, 1, 100)
    assert fitted_defaults(2, 40, None, None, batch_fragments=2) == (2, 40, 80)
