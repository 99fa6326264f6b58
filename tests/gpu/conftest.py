from tests.smoke.conftest import runs  # noqa: F401  (the same launcher fixture as the CPU runs)
