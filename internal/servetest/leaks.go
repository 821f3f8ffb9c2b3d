package servetest

import (
	"fmt"
	"net/http"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// goRedisRedial is go-redis's loop that dials a pool's connection again
// after a failure, a second apart: it ends by itself within a second of its
// pool's closing.
const goRedisRedial = "github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"

// RunWithoutLeaks runs a package's tests (a TestMain's m) and fails them
// when a goroutine they started is still running once they are done: every
// goroutine has an owner and an exit. The default HTTP client's idle
// connections (to servers the tests stopped) are closed first, as their
// goroutines are the client's, kept for reuse.
func RunWithoutLeaks(m *testing.M) {
	code := m.Run()
	http.DefaultClient.CloseIdleConnections()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreAnyFunction(goRedisRedial)); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
