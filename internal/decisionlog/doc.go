// Package decisionlog writes one JSON line per decision (and per reset)
// that the service makes: the instant, the domain, the descriptors and
// their hits, each limit's verdict and the config's version, so that a
// log can be replayed against another config (internal/replay). It is a
// service.Observer that the running server installs: a decision is
// encoded on its way, then queued to a writer goroutine; a full queue
// drops the record and counts it, and never waits. Logs are sampled by
// key and may hold keyed hashes instead of the values the config does not
// name.
//
// It knows no wire protocol and no store; it reads logs back (Read) for
// rls replay.
package decisionlog
