"""The one bound the tests put on a subprocess or a wait: a guard against a hang, never a verdict on speed.

A loaded 2-core CI machine runs the suite's end-to-end commands several times slower than an idle one; the guard
is far above any such run (20 min), and a test that hits it fails saying so (tests/conftest.py), not with a
TimeoutExpired traceback.
"""
HANG_GUARD_S = 1200
