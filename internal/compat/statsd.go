package compat

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/time/rate"
)

// The reference's sinks' network settings: its StatsD sink (gostats)
// dials for 1.5 s and gives a write 1 s; its DogStatsD client (datadog-go)
// sends UDP datagrams of 1432 bytes at most, the size that fits an
// Ethernet frame unfragmented, as gostats does over UDP.
const (
	statsdDialTimeout  = 1500 * time.Millisecond
	statsdWriteTimeout = time.Second
	statsdDatagram     = 1432
	// statsdTCPChunk is what one write over TCP carries at most (gostats's
	// buffer), each with its own deadline.
	statsdTCPChunk = 64 << 10
	// statsdTCPBuffer bounds what the kernel holds of unsent stats for a
	// collector that does not read: past it a write waits, then fails at
	// its deadline, and its lines are dropped.
	statsdTCPBuffer = 64 << 10
)

// statsdOptions say where and how the StatsD sink sends the reference's
// stats: USE_STATSD (gostats's line protocol, EXTRA_TAGS serialized into
// the names) or USE_DOG_STATSD (DogStatsD's, with tags and mogrifiers).
type statsdOptions struct {
	network string // "tcp" or "udp"
	addr    string // STATSD_HOST:STATSD_PORT
	dog     bool
	tags    []tag // EXTRA_TAGS, sorted by name
	// globalTags are DogStatsD's client's own tags ("k:v", from DD_ENV and
	// the like), first on every line.
	globalTags []string
	mogrifiers []mogrifier // USE_DOG_STATSD_MOGRIFIERS, in its order
	interval   time.Duration
}

// sinkName is the variable that turned the sink on.
func (o *statsdOptions) sinkName() string {
	if o.dog {
		return "USE_DOG_STATSD"
	}
	return "USE_STATSD"
}

// statsdSink sends envoyproxy/ratelimit's stats, named as its StatsD
// output names them, to a StatsD or DogStatsD collector every interval. It
// reads them from their Prometheus series (src: Stats and the local
// cache's gauges): counters as what they gained since the last flush (none
// when nothing), gauges as their value, as the reference's stats library
// flushes them. The decision path counts into those series and never
// waits on the sink; the series' bounds (series.Family) bound what a flush
// sends. A collector that is down or does not read costs the lines of a
// flush, counted in rls_statsd_lines_dropped_total, never a decision.
//
// A statsdSink is used by one goroutine: run.
type statsdSink struct {
	opts statsdOptions
	src  prometheus.Gatherer
	// plainTags are EXTRA_TAGS as gostats serializes them into a name
	// (".__k=v" by name); dogTags as DogStatsD tags ("k:v").
	plainTags string
	dogTags   []string
	// last are the counters' values at the last flush, by stat name.
	last map[string]uint64
	conn net.Conn // nil: dial at the next flush
	// dial and writeTimeout are a net.Dialer's with statsdDialTimeout, and
	// statsdWriteTimeout, but in tests.
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	writeTimeout  time.Duration
	sent, dropped prometheus.Counter
	log           *slog.Logger
	logEvery      rate.Sometimes
}

// newStatsdSink returns the sink of o reading src, its own counters
// registered in reg.
func newStatsdSink(o statsdOptions, src prometheus.Gatherer, reg prometheus.Registerer, log *slog.Logger) *statsdSink {
	k := &statsdSink{
		opts: o, src: src, log: log, last: map[string]uint64{},
		sent:     prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_statsd_lines_sent_total", Help: "StatsD lines of the reference's stats written to the collector's socket (USE_STATSD, USE_DOG_STATSD)."}),
		dropped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "rls_statsd_lines_dropped_total", Help: "StatsD lines of the reference's stats dropped: the collector could not be dialled, or a write failed or timed out."}),
		logEvery: rate.Sometimes{First: 1, Interval: time.Minute},
		dial:     (&net.Dialer{Timeout: statsdDialTimeout}).DialContext, writeTimeout: statsdWriteTimeout,
	}
	reg.MustRegister(k.sent, k.dropped)
	for _, t := range o.tags {
		v := statTagValue(t.value)
		k.plainTags += ".__" + t.name + "=" + v
		k.dogTags = append(k.dogTags, t.name+":"+v)
	}
	return k
}

// run flushes every interval until ctx ends, then flushes once more (the
// dial and the writes bounded by their timeouts) and closes the
// connection.
func (k *statsdSink) run(ctx context.Context) {
	t := time.NewTicker(k.opts.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			k.flush(ctx)
		case <-ctx.Done():
			k.flush(context.WithoutCancel(ctx))
			if k.conn != nil {
				k.conn.Close()
				k.conn = nil
			}
			return
		}
	}
}

// flush sends what the stats gained since the last flush.
func (k *statsdSink) flush(ctx context.Context) {
	mfs, err := k.src.Gather()
	if err != nil {
		// What was gathered is sent all the same.
		k.warn("statsd: reading the stats", "error", err)
	}
	buf, lines := k.appendLines(nil, mfs)
	if lines > 0 {
		k.send(ctx, buf, lines)
	}
}

// appendLines appends to dst the lines of mfs, counters as what they
// gained since the last call, and returns it with the number of lines.
// A counter that is lower than at the last call was made anew (a reload
// dropped its stats key, and a later one brought it back): it gained its
// value.
func (k *statsdSink) appendLines(dst []byte, mfs []*dto.MetricFamily) ([]byte, int) {
	next := make(map[string]uint64, len(k.last))
	lines := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name, ok := statsdName(mf.GetName(), m.GetLabel())
			if !ok {
				continue
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				v := uint64(m.GetCounter().GetValue())
				next[name] = v
				gained := v
				if prev, ok := k.last[name]; ok && prev <= v {
					gained = v - prev
				}
				if gained == 0 {
					continue
				}
				dst = k.appendLine(dst, name, gained, "c")
			case dto.MetricType_GAUGE:
				dst = k.appendLine(dst, name, uint64(m.GetGauge().GetValue()), "g")
			default:
				continue
			}
			lines++
		}
	}
	k.last = next
	return dst, lines
}

// appendLine appends the line of the stat name with value v of type typ
// ("c" or "g"): for StatsD, name, EXTRA_TAGS and `:v|typ`; for DogStatsD,
// name as the mogrifiers make it, `:v|typ` and the tags: the client's,
// EXTRA_TAGS, the mogrifier's.
func (k *statsdSink) appendLine(dst []byte, name string, v uint64, typ string) []byte {
	if !k.opts.dog {
		dst = append(dst, name...)
		dst = append(dst, k.plainTags...)
		dst = append(dst, ':')
		dst = strconv.AppendUint(dst, v, 10)
		dst = append(dst, '|')
		dst = append(dst, typ...)
		return append(dst, '\n')
	}
	name, mtags := mogrify(k.opts.mogrifiers, name)
	dst = append(dst, name...)
	dst = append(dst, ':')
	dst = strconv.AppendUint(dst, v, 10)
	dst = append(dst, '|')
	dst = append(dst, typ...)
	sep := "|#"
	for _, tags := range [][]string{k.opts.globalTags, k.dogTags, mtags} {
		for _, t := range tags {
			dst = append(dst, sep...)
			dst = appendWithout(dst, t, '\n')
			sep = ","
		}
	}
	return append(dst, '\n')
}

// send writes buf, lines lines, to the collector, dialling it first when
// there is no connection; what cannot be written is dropped and counted.
// After a failed write the connection is closed: the next flush dials
// again (and resolves the host again).
func (k *statsdSink) send(ctx context.Context, buf []byte, lines int) {
	if k.conn == nil {
		c, err := k.dial(ctx, k.opts.network, k.opts.addr)
		if err != nil {
			k.dropped.Add(float64(lines))
			k.warn("statsd: lines dropped", "error", err)
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetWriteBuffer(statsdTCPBuffer)
		}
		k.conn = c
	}
	chunk := statsdTCPChunk
	if k.opts.network == "udp" {
		chunk = statsdDatagram
	}
	written, err := writeLines(k.conn, buf, chunk, k.writeTimeout)
	sent := bytes.Count(buf[:written], []byte{'\n'})
	k.sent.Add(float64(sent))
	if err != nil {
		k.dropped.Add(float64(lines - sent))
		k.conn.Close()
		k.conn = nil
		k.warn("statsd: lines dropped", "error", err)
	}
}

// warn logs msg, at most once a minute, with the sink and the lines
// dropped so far.
func (k *statsdSink) warn(msg string, args ...any) {
	k.logEvery.Do(func() {
		k.log.Warn(msg, append(args, "sink", k.opts.sinkName(), "network", k.opts.network, "addr", k.opts.addr,
			"dropped_total", uint64(counterValue(k.dropped)))...)
	})
}

// writeLines writes buf (whole lines) to c in writes of at most chunk bytes
// that end at a line's end (a line longer than chunk alone), each given
// timeout, and returns how many bytes were written before an error.
func writeLines(c net.Conn, buf []byte, chunk int, timeout time.Duration) (int, error) {
	written := 0
	for written < len(buf) {
		end := min(written+chunk, len(buf))
		if end < len(buf) {
			if i := bytes.LastIndexByte(buf[written:end], '\n'); i >= 0 {
				end = written + i + 1
			} else if i := bytes.IndexByte(buf[end:], '\n'); i >= 0 {
				end += i + 1
			} else {
				end = len(buf)
			}
		}
		c.SetWriteDeadline(time.Now().Add(timeout))
		n, err := c.Write(buf[written:end])
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// statsdName is the reference's StatsD name of the series of family with
// labels, from its Prometheus name (Stats, localCacheCollectors):
// ratelimit_service_rate_limit_<stat>{domain,key1,key2} is
// ratelimit.service.rate_limit.<domain>.<key1>[.<key2>].<stat>, the stats
// key sanitized as the reference sanitizes it; the other ratelimit_service_
// and ratelimit_localcache_ series are ratelimit.service.<stat> and
// ratelimit.localcache.<stat>. false: a series the reference has no stat
// for.
func statsdName(family string, labels []*dto.LabelPair) (string, bool) {
	if stat, ok := strings.CutPrefix(family, "ratelimit_service_rate_limit_"); ok {
		var domain, key1, key2 string
		for _, l := range labels {
			switch l.GetName() {
			case "domain":
				domain = l.GetValue()
			case "key1":
				key1 = l.GetValue()
			case "key2":
				key2 = l.GetValue()
			}
		}
		key := domain + "." + key1
		if key2 != "" {
			key += "." + key2
		}
		return "ratelimit.service.rate_limit." + sanitizeStatName(key) + "." + stat, true
	}
	if stat, ok := strings.CutPrefix(family, "ratelimit_service_"); ok {
		return "ratelimit.service." + stat, true
	}
	if stat, ok := strings.CutPrefix(family, "ratelimit_localcache_"); ok {
		return "ratelimit.localcache." + stat, true
	}
	return "", false
}

// sanitizeStatName is a stats key as the reference puts it in a stat's
// name: ':' and '|' (which end a StatsD name) as '_', and the dots of what
// looks like an IPv4 address as '_' (utils.SanitizeStatName); rls also
// turns line ends into '_', which would split the line.
func sanitizeStatName(s string) string {
	s = strings.Map(func(r rune) rune {
		switch r {
		case ':', '|', '\n', '\r':
			return '_'
		}
		return r
	}, s)
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}

var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// statTagValue is an EXTRA_TAGS value as the reference's stats library
// keeps it: '.', ':' and '|' as '_' (with DogStatsD too: its tags are read
// back from the names), and line ends as '_'.
func statTagValue(v string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', ':', '|', '\n', '\r':
			return '_'
		}
		return r
	}, v)
}

// appendWithout appends s to dst without the bytes c.
func appendWithout(dst []byte, s string, c byte) []byte {
	for i := range len(s) {
		if s[i] != c {
			dst = append(dst, s[i])
		}
	}
	return dst
}

// counterValue is c's value.
func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}

// mogrifier is one of USE_DOG_STATSD_MOGRIFIERS: a stat whose name matches
// pattern is sent under name, with tags, where $N in either stands for the
// pattern's group N (left as it is past the last group).
type mogrifier struct {
	pattern *regexp.Regexp
	name    string
	tags    []tag // sorted by name
}

// mogrify is name and tags as the first of ms that matches name makes
// them; name itself and no tags when none does.
func mogrify(ms []mogrifier, name string) (string, []string) {
	for _, m := range ms {
		groups := m.pattern.FindStringSubmatch(name)
		if groups == nil {
			continue
		}
		tags := make([]string, len(m.tags))
		for i, t := range m.tags {
			tags[i] = t.name + ":" + expandGroups(t.value, groups)
		}
		return expandGroups(m.name, groups), tags
	}
	return name, nil
}

// expandGroups is s with each $N replaced by groups[N]; a $N past the
// last group stays as it is.
func expandGroups(s string, groups []string) string {
	return groupRef.ReplaceAllStringFunc(s, func(ref string) string {
		if i, err := strconv.Atoi(ref[1:]); err == nil && i < len(groups) {
			return groups[i]
		}
		return ref
	})
}

var groupRef = regexp.MustCompile(`\$\d+`)

// parseMogrifier reads the mogrifier of USE_DOG_STATSD_MOGRIFIERS named
// name from vars, as the reference reads it:
// DOG_STATSD_MOGRIFIER_<NAME>_PATTERN (a regular expression, required),
// _NAME (required) and _TAGS (k:$1,k2:v; every item key:value, neither
// empty). It returns the variables it read, and an *envError naming the
// one at fault.
func parseMogrifier(mogrifierName string, vars map[string]string) (mogrifier, []string, error) {
	prefix := "DOG_STATSD_MOGRIFIER_" + strings.ToUpper(mogrifierName) + "_"
	pv, nv, tv := prefix+"PATTERN", prefix+"NAME", prefix+"TAGS"
	why := fmt.Sprintf("mogrifier %q of USE_DOG_STATSD_MOGRIFIERS", mogrifierName)
	var m mogrifier
	pattern, name := vars[pv], vars[nv]
	if pattern == "" {
		return m, nil, &envError{pv, pattern, "empty or unset: " + why + " needs a pattern"}
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return m, nil, &envError{pv, pattern, "not a regular expression: " + err.Error()}
	}
	if name == "" {
		return m, nil, &envError{nv, name, "empty or unset: " + why + " needs a name"}
	}
	m.pattern, m.name = re, name
	if v := vars[tv]; v != "" {
		byName := map[string]string{}
		for _, item := range strings.Split(v, ",") {
			kv := strings.Split(item, ":")
			switch {
			case len(kv) != 2:
				return m, nil, &envError{tv, v, fmt.Sprintf("item %q is not key:value", item)}
			case kv[0] == "" || kv[1] == "":
				return m, nil, &envError{tv, v, fmt.Sprintf("item %q has an empty key or value", item)}
			}
			byName[kv[0]] = kv[1]
		}
		for _, k := range slices.Sorted(maps.Keys(byName)) {
			m.tags = append(m.tags, tag{k, byName[k]})
		}
	}
	return m, []string{pv, nv, tv}, nil
}
