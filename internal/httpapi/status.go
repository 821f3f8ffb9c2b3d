package httpapi

import (
	"context"
	"net/http"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/rlsproject/rls/internal/reloadlog"
	"github.com/rlsproject/rls/internal/rlqs"
)

// RLQSStreams lists the RLQS streams served; *rlqs.Server implements it.
type RLQSStreams interface {
	Streams() []rlqs.StreamStatus
}

// The JSON of GET /debug/status (a field's name and form are part of the
// API; the operator page reads it). Counters are totals since the process
// started: a reader takes rates from two answers.

// StatusResult is the answer of GET /debug/status: what the process holds
// now, read from its metrics registry, its reload log and its store.
type StatusResult struct {
	Time  time.Time   `json:"time"`
	Store StoreStatus `json:"store"`
	// Limits are the limits that have decided something, by domain and
	// limit label (as /debug/config's "label" and the metrics' "limit").
	Limits  []LimitStatus    `json:"limits"`
	Reloads []reloadlog.Load `json:"reloads"`
	RLQS    RLQSStatus       `json:"rlqs"`
	Leases  LeaseStatus      `json:"leases"`
}

// StoreStatus is the store's health: a ping now, and its calls so far.
type StoreStatus struct {
	Kind string `json:"kind"`
	// Ready is true when a config is loaded and the store answered a
	// ping (Error says why not) within a second, in PingSeconds.
	Ready       bool    `json:"ready"`
	Error       string  `json:"error,omitempty"`
	PingSeconds float64 `json:"ping_seconds"`
	// Calls, Errors and Seconds are the store calls of decisions
	// (rls_store_duration_seconds, rls_store_errors_total).
	Calls   uint64  `json:"calls"`
	Errors  uint64  `json:"errors"`
	Seconds float64 `json:"seconds"`
	// Nodes are the store's servers (Redis's nodes, every master of a
	// cluster), each pinged on its own now; absent on the memory store.
	Nodes []StoreNode `json:"nodes,omitempty"`
}

// StoreNode is one server of the store and how it answered a ping.
type StoreNode struct {
	Addr    string  `json:"addr"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
}

// LimitStatus is one limit's decisions (rls_decisions_total) and its keys
// at least half spent now (rls_limit_keys_fullness).
type LimitStatus struct {
	Domain          string `json:"domain"`
	Limit           string `json:"limit"`
	OK              uint64 `json:"ok"`
	OverLimit       uint64 `json:"over_limit"`
	ShadowOverLimit uint64 `json:"shadow_over_limit,omitempty"`
	// KeysHalf, Keys80 and KeysFull count the keys at least 0.5, 0.8 and
	// 1 of the limit spent (cumulative, from a bounded sample).
	KeysHalf uint64 `json:"keys_half_full"`
	Keys80   uint64 `json:"keys_80_full"`
	KeysFull uint64 `json:"keys_full"`
}

// RLQSStatus is the RLQS server's streams and buckets now (rls_rlqs_*).
type RLQSStatus struct {
	Streams uint64 `json:"streams"`
	Buckets uint64 `json:"buckets"`
	// Granted is the requests taken for the token buckets handed out;
	// Allowed and Denied those the clients report.
	Granted uint64 `json:"granted_requests"`
	Allowed uint64 `json:"reported_allowed"`
	Denied  uint64 `json:"reported_denied"`
	// List is the streams served, with their buckets (bounded: see
	// rlqs.MaxListedStreams).
	List []rlqs.StreamStatus `json:"stream_list"`
}

// LeaseStatus is the leased slices this process holds (rls_lease_*).
type LeaseStatus struct {
	HitsHeld    uint64 `json:"hits_held"`
	Counters    uint64 `json:"counters"`
	SlicesTaken uint64 `json:"slices_taken"`
	HitsLocal   uint64 `json:"hits_local"`
	HitsLost    uint64 `json:"hits_lost"`
}

// status answers GET /debug/status.
func (h *handler) status(w http.ResponseWriter, r *http.Request) {
	out := StatusResult{Time: time.Now().UTC(), Limits: []LimitStatus{}, Reloads: []reloadlog.Load{}, Store: StoreStatus{Kind: h.StoreName}}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	start := time.Now()
	err := h.Service.Ready(ctx)
	out.Store.PingSeconds = time.Since(start).Seconds()
	if h.StoreNodes != nil {
		out.Store.Nodes = h.StoreNodes(ctx)
	}
	cancel()
	out.Store.Ready = err == nil
	if err != nil {
		out.Store.Error = err.Error()
	}
	if h.Reloads != nil {
		out.Reloads = append(out.Reloads, h.Reloads()...)
	}
	families, err := h.Gatherer.Gather()
	if err != nil && len(families) == 0 {
		http.Error(w, "gathering metrics: "+err.Error(), http.StatusInternalServerError)
		return
	}
	byName := make(map[string]*dto.MetricFamily, len(families))
	for _, f := range families {
		byName[f.GetName()] = f
	}
	out.Limits = limitStatus(byName)
	st := &out.Store
	for _, m := range byName["rls_store_duration_seconds"].GetMetric() {
		st.Calls += m.GetHistogram().GetSampleCount()
		st.Seconds += m.GetHistogram().GetSampleSum()
	}
	st.Errors = sum(byName, "rls_store_errors_total")
	q := &out.RLQS
	q.List = []rlqs.StreamStatus{}
	if h.RLQS != nil {
		q.List = append(q.List, h.RLQS.Streams()...)
	}
	q.Streams, q.Buckets, q.Granted = sum(byName, "rls_rlqs_streams"), sum(byName, "rls_rlqs_buckets"), sum(byName, "rls_rlqs_granted_requests_total")
	for _, m := range byName["rls_rlqs_requests_reported_total"].GetMetric() {
		switch label(m, "result") {
		case "allowed":
			q.Allowed += uint64(m.GetCounter().GetValue())
		case "denied":
			q.Denied += uint64(m.GetCounter().GetValue())
		}
	}
	l := &out.Leases
	l.HitsHeld, l.Counters, l.SlicesTaken = sum(byName, "rls_lease_hits_held"), sum(byName, "rls_lease_counters"), sum(byName, "rls_lease_slices_taken_total")
	l.HitsLocal, l.HitsLost = sum(byName, "rls_lease_hits_local_total"), sum(byName, "rls_lease_hits_lost_total")
	writeJSON(w, out)
}

// limitStatus is the limits of rls_decisions_total and
// rls_limit_keys_fullness, by domain then limit.
func limitStatus(byName map[string]*dto.MetricFamily) []LimitStatus {
	type id struct{ domain, limit string }
	limits := map[id]*LimitStatus{}
	get := func(m *dto.Metric) *LimitStatus {
		k := id{label(m, "domain"), label(m, "limit")}
		if limits[k] == nil {
			limits[k] = &LimitStatus{Domain: k.domain, Limit: k.limit}
		}
		return limits[k]
	}
	for _, m := range byName["rls_decisions_total"].GetMetric() {
		n := uint64(m.GetCounter().GetValue())
		switch ls := get(m); label(m, "result") {
		case "ok":
			ls.OK += n
		case "over_limit":
			ls.OverLimit += n
		case "shadow_over_limit":
			ls.ShadowOverLimit += n
		}
	}
	for _, m := range byName["rls_limit_keys_fullness"].GetMetric() {
		n := uint64(m.GetGauge().GetValue())
		switch ls := get(m); label(m, "above") {
		case "0.5":
			ls.KeysHalf = n
		case "0.8":
			ls.Keys80 = n
		case "1":
			ls.KeysFull = n
		}
	}
	out := make([]LimitStatus, 0, len(limits))
	for _, ls := range limits {
		out = append(out, *ls)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Domain != out[j].Domain {
			return out[i].Domain < out[j].Domain
		}
		return out[i].Limit < out[j].Limit
	})
	return out
}

// sum is the sum of a counter's or gauge's series; 0 when there is none.
func sum(byName map[string]*dto.MetricFamily, name string) uint64 {
	var v float64
	for _, m := range byName[name].GetMetric() {
		v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return uint64(v)
}

// label is the value of m's label name, "" when it has none.
func label(m *dto.Metric, name string) string {
	for _, p := range m.GetLabel() {
		if p.GetName() == name {
			return p.GetValue()
		}
	}
	return ""
}
