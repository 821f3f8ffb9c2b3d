// Package decisionmetrics is rls's own Prometheus metrics of its
// decisions, a service.Observer that the running server installs: verdicts
// by limit (and by request value where the config asks), requests by code,
// store calls, config loads, what a config cannot answer well (unmatched
// descriptors, impossible requests), the limits' values, and how full the
// keys of each limit are (a bounded sample). The service knows nothing of
// it; it knows nothing of wire protocols or stores.
package decisionmetrics
