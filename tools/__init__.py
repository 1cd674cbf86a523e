"""Tools for the test suite, run as ``python -m tools.NAME`` from the repository root: its wall time
(``suite_time``), each test's CPU-seconds (``cpu_per_test``, a pytest plugin) and a command's CPU-seconds by kind of
process (``cpu_by_process``)."""
