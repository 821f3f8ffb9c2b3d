package decisionlog_test

import (
	"testing"

	"github.com/rlsproject/rls/internal/servetest"
)

// TestMain fails the tests that leave a goroutine running.
func TestMain(m *testing.M) { servetest.RunWithoutLeaks(m) }
