"""Writes outside the cluster, each a named step of the reconcile."""
