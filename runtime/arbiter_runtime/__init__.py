"""Arbiter's decision runtime: a KServe V2 decision server in front of vLLM (see docs/runtime.md)."""

__version__ = "0.1.0"
