"""What many tests share: the examples users start from (examples), the one DecisionModel factory (factory) and the
one polling helper (polling). Imported as `support.<module>`: pytest puts tests/ on sys.path (rootdir conftest)."""
