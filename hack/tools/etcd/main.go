// Command etcd is etcd's own main, rebuilt from the etcd server module so the test control plane needs no download
// beyond the Go module proxy. It mirrors go.etcd.io/etcd/v3's main.go.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
