"""`kubectl arbiter dashboard`: a local, read-only web page of every DecisionModel and its promotions.

store.py holds what the watches and Prometheus said; render.py and charts.py make the page from it (pure: state in,
HTML out); server.py serves it and keeps the store fresh.
"""
