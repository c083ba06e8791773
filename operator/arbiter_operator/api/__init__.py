"""The DecisionModel API: pydantic models (the single source of truth), conditions, CRD generation."""
