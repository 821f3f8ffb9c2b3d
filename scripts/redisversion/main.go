// Command redisversion prints the version line of the Redis-protocol
// server that the tests start (RLS_TEST_REDIS_SERVER, else redis-server
// in PATH) and its path: `make test-store` says what it ran on.
package main

import (
	"fmt"
	"os"

	"github.com/rlsproject/rls/internal/proctest"
)

func main() {
	bin, err := proctest.RedisServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	v, err := proctest.RedisVersion()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cli, err := proctest.RedisCLI()
	if err != nil {
		cli = err.Error()
	}
	fmt.Printf("server: %s (%s)\nclient: %s\n", v, bin, cli)
}
