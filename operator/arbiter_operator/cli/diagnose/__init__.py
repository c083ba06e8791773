"""`kubectl arbiter diagnose`: evidence gathered thinly, judged by a pure function (rules.py)."""
