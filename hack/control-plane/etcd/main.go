// Command etcd is upstream etcd's server, built from the published
// go.etcd.io/etcd/server/v3 module for the real control plane under the tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
