package decisionlog

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionmetrics"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
	"github.com/rlsproject/rls/internal/topkeys"
)

// BenchmarkDecision measures a decision of one descriptor that three
// limits judge on the memory store with the observers the running server
// installs: rls's metrics alone (what rls did before top keys and the
// log), with the top keys (the default now), and with the decision log on
// at 100 % (written to io.Discard by its writer), sampled at 1 %, and with
// a stuck writer (every record dropped). The keys cycle over 1000
// addresses, as a server's do.
func BenchmarkDecision(b *testing.B) {
	cfg, err := config.Parse("b.yaml", []byte(`
domain: api
descriptors:
  - key: remote_address
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000}
      - {unit: minute, requests_per_unit: 1000000000}
      - {unit: hour, requests_per_unit: 1000000000, algorithm: sliding_window}
`))
	if err != nil {
		b.Fatal(err)
	}
	for _, v := range []struct {
		name  string
		top   bool
		log   *Options
		stuck bool
	}{
		{"metrics", false, nil, false},
		{"metrics+top", true, nil, false},
		{"metrics+top+log100", true, &Options{Path: "-", Stdout: io.Discard}, false},
		{"metrics+top+log1pct", true, &Options{Path: "-", Stdout: io.Discard, Sample: 0.01}, false},
		{"metrics+top+logstuck", true, &Options{Path: "-", Queue: 16}, true},
	} {
		b.Run(v.name, func(b *testing.B) {
			ms := memstore.New(memstore.Options{})
			defer ms.Close()
			obs := []service.Observer{decisionmetrics.New(prometheus.NewRegistry(), decisionmetrics.Options{})}
			if v.top {
				obs = append(obs, topkeys.New(topkeys.Options{}))
			}
			var l *Log
			stuck := &blockingWriter{entered: make(chan struct{}), release: make(chan struct{})}
			if v.log != nil {
				opts := *v.log
				if v.stuck {
					opts.Stdout = stuck
				}
				var err error
				if l, err = New(opts); err != nil {
					b.Fatal(err)
				}
				l.Start()
				defer func() {
					close(stuck.release)
					l.Close()
				}()
				obs = append(obs, l)
			}
			svc := service.New(service.Options{Store: ms, Observers: obs})
			svc.SetConfig(cfg)
			reqs := make([]*service.Request, 1000)
			for i := range reqs {
				reqs[i] = &service.Request{Domain: "api", Descriptors: []service.Descriptor{desc("remote_address", fmt.Sprintf("10.0.%d.%d", i/256, i%256))}}
			}
			ctx := context.Background()
			if v.stuck {
				svc.ShouldRateLimit(ctx, reqs[0])
				<-stuck.entered
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := svc.ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if l != nil {
				st := l.Stats()
				b.ReportMetric(float64(st.Dropped)/float64(i), "dropped/op")
			}
		})
	}
}
