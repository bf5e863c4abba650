"""The pre-publish suites, run against the INSTALLED package: ``python -m polykernels.suites``.

The gate runs them on every wheel before it is published; users can run them as a self-test.
Each suite is a module with ``NAME`` and ``run(device) -> SuiteResult``.
"""

from polykernels.suites.runner import SUITE_MODULES, run_suites

__all__ = ["SUITE_MODULES", "run_suites"]
