"""Development environment, outside the product (neither the operator wheel nor an image carries it): Go-built
binaries (tools), a throwaway control plane (controlplane) and cluster (cluster, kwok, kserve), a SeaweedFS S3 server
(s3server), Model Registry on PostgreSQL (registryserver), Argo CD and OLM (argocd, olm), the upstream CRDs (crds), the
operator as a subprocess (operator_process), the local run (local, first_decision), the OLM bundle generator
(olmbundle), the chart's dashboards generator (dashboards) and the vLLM stand-in (vllm_standin). Shared by the
tests, the benchmarks and the local run command. See docs/devenv.md."""
