// Package reloadlog keeps the last config loads of the process (when, what
// failed, which limits changed) for GET /debug/status and the operator
// page. It is an observer of the service: it sees each config as it
// becomes current and each load's outcome, never a decision.
package reloadlog

import (
	"sync"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/service"
)

// DefaultKeep is how many loads a Log keeps.
const DefaultKeep = 20

// MaxChanges is how many changes of one load a Log keeps (the first in
// the config's order); Load.MoreChanges counts the others, so that the
// log of a config of 100,000 limits stays small.
const MaxChanges = 100

// Load is one config load.
type Load struct {
	Time time.Time `json:"time"`
	// Error is why the load failed (the previous config stayed); empty
	// when it succeeded.
	Error string `json:"error,omitempty"`
	// Domains and Limits count the config in use after the load.
	Domains int `json:"domains"`
	Limits  int `json:"limits"`
	// Changes are the limits the load added, removed or changed (nil for
	// a failed load), at most MaxChanges; MoreChanges counts the others.
	Changes     []config.LimitChange `json:"changes,omitempty"`
	MoreChanges int                  `json:"more_changes,omitempty"`
}

// Log keeps the last loads, newest first. Safe for concurrent use; the
// zero value is not usable (New).
type Log struct {
	now  func() time.Time
	keep int

	mu      sync.Mutex
	current *config.Config // the config in use, for the next diff
	pending *config.Config // the config ForConfig saw, until Reloaded
	loads   []Load         // newest first, at most keep
}

var _ service.Observer = (*Log)(nil)

// New returns a log of the last keep loads (≤ 0: DefaultKeep), timed by
// now (nil: time.Now).
func New(keep int, now func() time.Time) *Log {
	if keep <= 0 {
		keep = DefaultKeep
	}
	if now == nil {
		now = time.Now
	}
	return &Log{now: now, keep: keep}
}

// Loads returns the loads kept, newest first. The slice is new.
func (l *Log) Loads() []Load {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Load(nil), l.loads...)
}

// ForConfig implements service.Observer: cfg is becoming current.
func (l *Log) ForConfig(cfg *config.Config) any {
	l.mu.Lock()
	l.pending = cfg
	l.mu.Unlock()
	return nil
}

// Reloaded implements service.Observer: it records the load.
func (l *Log) Reloaded(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ld := Load{Time: l.now()}
	if err != nil {
		ld.Error = err.Error()
	} else if l.pending != nil {
		ld.Changes = config.Diff(l.current, l.pending)
		if n := len(ld.Changes); n > MaxChanges {
			ld.Changes, ld.MoreChanges = ld.Changes[:MaxChanges:MaxChanges], n-MaxChanges
		}
		l.current, l.pending = l.pending, nil
	}
	ld.Domains, ld.Limits = len(l.current.Domains()), len(l.current.Limits())
	l.loads = append([]Load{ld}, l.loads...)
	if len(l.loads) > l.keep {
		l.loads = l.loads[:l.keep]
	}
}

// Decided implements service.Observer; a decision is not a load.
func (*Log) Decided(any, *service.Decision) {}

// Cleared implements service.Observer; a reset is not a load.
func (*Log) Cleared(any, *service.Cleared) {}
