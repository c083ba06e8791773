"""Reads: what exists for one DecisionModel, in the cluster and outside it (S3, Model Registry, Prometheus)."""
