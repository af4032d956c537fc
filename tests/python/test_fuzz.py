"""Bounded fuzz run over the public Python API (tests/python/fuzzlib.py): the fixed repros of
the known defects, then seeded random valid and mutated calls, each judged by the oracles of
fuzzlib (lowbit's own error naming an argument, no array changed by a refused call, results
equal to the NumPy reference, no crash). One test per category of finding, so that a failure
says what kind of defect was found; the message lists the calls (seed and index: replay one with
``python tests/python/fuzzlib.py --seed S --replay I``).

    LOWBIT_FUZZ_SECONDS   wall-clock budget of the random calls (default 35)
    LOWBIT_FUZZ_SEED      seed (default 0)
    LOWBIT_FUZZ_CALLS     run exactly this many calls instead (the long runs of scripts/fuzz.sh)
"""

import pytest

import fuzzlib

SEED = fuzzlib.env_int("LOWBIT_FUZZ_SEED", 0)
SECONDS = fuzzlib.env_float("LOWBIT_FUZZ_SECONDS", 35.0)
CALLS = fuzzlib.env_int("LOWBIT_FUZZ_CALLS", None)

API_CATEGORIES = ["crash", "sanitizer", "hang", "foreign_error", "unnamed_refusal", "output_changed",
                  "readonly_written", "input_changed", "accepted_invalid", "wrong_result", "precision_loss",
                  "refused_valid", "unclear_refusal", "harness_error"]


@pytest.fixture(scope="module")
def api_run():
    return fuzzlib.run_api_fuzz(SEED, SECONDS, CALLS)


def _fail_message(run, category):
    return fuzzlib.fail_message(run, category, SEED, "calls", lambda f: (f["call"].split("(")[0], f["msg"][:50]), 240)


def test_api_fuzz_ran(api_run):
    assert api_run.calls >= fuzzlib.known_count(), api_run.report(SEED)


@pytest.mark.parametrize("category", API_CATEGORIES)
def test_api_fuzz(api_run, category):
    if api_run.by_category().get(category):
        pytest.fail(_fail_message(api_run, category), pytrace=False)


def test_calls_are_deterministic():
    """Call i of a seed is the same call whenever it is generated (replays reproduce findings)."""
    n = fuzzlib.known_count()
    for i in (n, n + 1, n + 7, n + 100):
        assert fuzzlib.get_call(3, i).describe() == fuzzlib.get_call(3, i).describe()
