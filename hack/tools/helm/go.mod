module arbiter.dev/hack/tools/helm

go 1.26.0
