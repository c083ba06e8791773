"""The operator's Kubernetes machinery, named as controller-runtime names its parts: `kinds` (every kind, declared once:
the REST mapper and how each kind is watched), `transport` (one aiohttp session to the apiserver), `client` (the
verbs a reconcile uses, all awaited), `events` (Event series), `resource` (a watched kind and what a well-formed
answer is), `watch` (list and watch), `cache` (the watch cache the reconcile reads), `workqueue` (the deduplicating
work queue), `namespaces` (the namespace label watches), `leader` (Lease election), `shard` (the namespaces a replica
owns), `authn` (who may read the operator's metrics: a TokenReview and a SubjectAccessReview, as controller-runtime's
metrics filter asks them). It imports only `api/` and `metrics`; the domain (observe, plan, apply) sits above it."""
