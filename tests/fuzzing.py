"""How many examples a fuzz test draws: a small fixed count in CI, many more on request.

Why: CI must stay fast and deterministic (the ``ci`` profile in ``conftest.py`` derandomizes
every property test), yet fuzzing only pays off when someone lets it search for long. A fuzz
test declares its CI count through :func:`fuzz_settings`; the ``long`` profile scales every
such count by its ``max_examples / 100`` (25x) and draws fresh examples each run::

    HYPOTHESIS_PROFILE=long .venv/bin/pytest -q tests/runtime/test_kv_store_fuzz.py
    .venv/bin/pytest -q --hypothesis-profile=long tests/grammars/test_tagger_agreement.py
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings


def fuzz_settings(ci_examples: int, **overrides: Any) -> settings:
    """Settings drawing ``ci_examples`` examples under the default profiles, more under long."""
    scale = settings.default.max_examples / 100
    return settings(
        max_examples=max(1, round(ci_examples * scale)),
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
        **overrides,
    )
