"""The suite's hypothesis profiles, registered in one place and chosen by `TALLY_HYPOTHESIS`.

- `default` (the variable unset or empty): derandomised, so every run tries the same examples
  and a failure reproduces on any machine; few examples, so `make test` stays fast.
- `ci`: also derandomised (a CI failure reproduces locally with `TALLY_HYPOTHESIS=ci`), with
  many more examples: each property test asks `examples(default, ci)` for its count.

No deadline in either: the properties reconcile whole logs on a shared machine, where one slow
example says nothing about the code. tests/conftest.py loads the profile before any test runs.
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILES = ("default", "ci")
CI_FACTOR = 10  # a property that names no ci count runs ten times its default under `ci`


class UnknownProfile(Exception):
    """Raised by `load` when TALLY_HYPOTHESIS names a profile this module does not register."""


def current() -> str:
    """The profile TALLY_HYPOTHESIS names (`default` when unset or empty)."""
    name = os.environ.get("TALLY_HYPOTHESIS", "").strip() or "default"
    if name not in PROFILES:
        raise UnknownProfile(f"TALLY_HYPOTHESIS={name!r}: expected one of {', '.join(PROFILES)}")
    return name


def examples(default: int, ci: int | None = None) -> int:
    """A property test's example count under the current profile."""
    if current() == "ci":
        return ci if ci is not None else default * CI_FACTOR
    return default


def load() -> None:
    settings.register_profile("default", derandomize=True, deadline=None, print_blob=True)
    settings.register_profile(
        "ci", derandomize=True, deadline=None, print_blob=True, max_examples=100 * CI_FACTOR
    )
    settings.load_profile(current())
