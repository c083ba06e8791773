"""Development environment: Go-built binaries (tools), a throwaway control plane (controlplane), a MinIO S3 server
(s3server) and the upstream CRDs (crds), shared by the tests and the local run command. See docs/devenv.md."""
