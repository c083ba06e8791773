// Command minio is MinIO's own main, rebuilt from the github.com/minio/minio module so the tests get a real S3
// server from the Go module proxy alone. It mirrors the upstream main.go.
package main

import (
	"os"

	minio "github.com/minio/minio/cmd"
)

func main() {
	minio.Main(os.Args)
}
