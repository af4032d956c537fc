"""Bounded mutation fuzz of the safetensors reader and the `lowbit` command line
(tests/python/fuzzfiles.py): fixed scenarios (paths that are not regular files, --report
clashes, existing outputs, SIGTERM / SIGHUP, a file truncated while read, duplicate names,
nested JSON, inconsistent lowbit metadata, NaN in the error table), then seeded random
mutations of small checkpoints through the reader, the CLI in-process and a sample of CLI
subprocesses. One test per category of finding; replay one case with
``python tests/python/fuzzfiles.py --seed S --replay I``.

    LOWBIT_FUZZ_FILES_SECONDS   wall-clock budget of the random files (default 20)
    LOWBIT_FUZZ_SEED            seed (default 0)
    LOWBIT_FUZZ_FILES           run exactly this many files instead
"""

import pytest

import fuzzfiles
import fuzzlib

SEED = fuzzlib.env_int("LOWBIT_FUZZ_SEED", 0)
SECONDS = fuzzlib.env_float("LOWBIT_FUZZ_FILES_SECONDS", 20.0)
FILES = fuzzlib.env_int("LOWBIT_FUZZ_FILES", None)

FILE_CATEGORIES = ["crash", "sanitizer", "hang", "foreign_error", "unnamed_refusal", "accepted_invalid",
                   "input_changed", "wrong_result", "temp_file_left", "stray_file", "slow", "harness_error"]


@pytest.fixture(scope="module")
def file_run():
    return fuzzfiles.run_file_fuzz(SEED, SECONDS, FILES)


def _fail_message(run, category):
    return fuzzlib.fail_message(run, category, SEED, "files", lambda f: f["msg"][:50], 200)


def test_file_fuzz_ran(file_run):
    assert file_run.calls >= len(fuzzfiles.KNOWN_FILES), file_run.report(SEED)


@pytest.mark.parametrize("category", FILE_CATEGORIES)
def test_file_fuzz(file_run, category):
    if file_run.by_category().get(category):
        pytest.fail(_fail_message(file_run, category), pytrace=False)
