// Package daemon is the running rls server: the store, the service (with
// rls's own metrics as its first observer), the gRPC and HTTP listeners and
// the config source, started from one typed Config, served until a context
// ends, then drained. A front end builds the
// Config (cmd/rls from its flags and RLS_ variables; internal/compat from
// envoyproxy/ratelimit's environment) and may plug in what it adds to rls's
// own server: observers and answer rules of the service, a config source,
// extra listeners, tasks that run until the server has drained.
//
// It reads no flags, environment variables or signals (the program does)
// and knows nothing of the front ends: nothing here names envoyproxy/ratelimit.
package daemon
