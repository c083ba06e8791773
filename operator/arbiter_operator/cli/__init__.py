"""kubectl plugin (kubectl-arbiter)."""
