// Package browser_test drives the operator page (/ui/) in a real browser,
// Debian's chromium, against a running rls: one browser and one rls for
// the package. With RLS_UI_SHOTS=DIR (make ui-shots) it also writes a
// screenshot of each view into DIR.
package browser_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/color/palette"
	"image/draw"
	"image/png"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rlsproject/rls/internal/daemon"
	"github.com/rlsproject/rls/internal/servetest"
)

const limits = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2, name: per_user}
  - key: tenant
    descriptors:
      - key: plan
        value: gold
        rate_limits:
          - {unit: minute, requests_per_unit: 100, lease: true}
          - {unit: day, requests_per_unit: 10000, algorithm: sliding_window}
---
domain: login
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 5, penalty: [1m, 10m]}
`

const token = "page-test-token"

// bound is how long the page has to show what rls holds: a behavioural
// bound (the page refreshes every 3 s), far above what it takes.
const bound = 30 * time.Second

// chromium returns the browser's path; without one the test fails under
// CI=true and is skipped elsewhere, saying what to install.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "chromium not found: install it (Debian/Ubuntu: apt-get install -y --no-install-recommends chromium); make prereqs does this"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// running is an rls that startRLS started, and its config file.
type running struct {
	*daemon.Server
	grpcAddr, httpAddr, configPath string
}

// startRLS runs rls serve --ui --admin-token-file F --admin-require-token
// on loopback with the memory store until the test ends.
func startRLS(t *testing.T) running {
	t.Helper()
	dir := t.TempDir()
	cfgPath, tokenPath := filepath.Join(dir, "limits.yaml"), filepath.Join(dir, "token")
	for path, text := range map[string]string{cfgPath: limits, tokenPath: token + "\n"} {
		if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	c := daemon.Defaults()
	c.Listeners.GRPCAddr, c.Listeners.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	c.Listeners.ShutdownTimeout = 5 * time.Second
	c.Listeners.UI, c.Listeners.AdminTokenFile, c.Listeners.AdminRequireToken = true, tokenPath, true
	c.Files.Path, c.Files.Watch = cfgPath, false
	logs := &servetest.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := daemon.New(ctx, c, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		cancel()
		t.Fatalf("daemon.New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("rls: %v", err)
		}
		if t.Failed() {
			t.Logf("rls logs:\n%s", logs)
		}
	})
	g, h := s.Addrs()
	return running{Server: s, grpcAddr: g.String(), httpAddr: h.String(), configPath: cfgPath}
}

// browser is one headless chromium tab, and what its console said.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	errs []string // console errors, exceptions, log errors other than refused requests
}

// startBrowser starts chromium with the flags this machine's closed network
// needs and a new profile; it and the goroutines reading its events end
// with the test.
func startBrowser(t *testing.T, path string) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 800),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	b := &browser{ctx: ctx}
	if _, err := chromedp.Call(ctx, cdplog.Enable, cdp.Empty{}); err != nil {
		cancel()
		cancelAlloc()
		t.Fatalf("starting %s: %v", path, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ev, err := range chromedp.Events(ctx, runtime.ConsoleAPICalled) {
			if err != nil {
				return
			}
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				b.addErr("console.error: %v", ev.Args)
			}
		}
	})
	wg.Go(func() {
		for ev, err := range chromedp.Events(ctx, runtime.ExceptionThrown) {
			if err != nil {
				return
			}
			b.addErr("exception: %s", ev.ExceptionDetails.Text)
		}
	})
	wg.Go(func() {
		for ev, err := range chromedp.Events(ctx, cdplog.EntryAdded) {
			if err != nil {
				return
			}
			// A refused request is logged by the browser (source
			// network); the test makes one on purpose.
			if e := ev.Entry; e.Level == cdplog.EntryLevelError && e.Source != cdplog.EntrySourceNetwork {
				b.addErr("%s: %s (%s)", e.Source, e.Text, e.URL)
			}
		}
	})
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		wg.Wait()
	})
	return b
}

func (b *browser) addErr(format string, args ...any) {
	b.mu.Lock()
	b.errs = append(b.errs, fmt.Sprintf(format, args...))
	b.mu.Unlock()
}

// do runs actions, failing the test with step's name.
func (b *browser) do(t *testing.T, step string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, bound)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v\npage says: %s", step, err, b.text(t, "#say"))
	}
}

// text is the text of the first element that css selects ("" when none).
func (b *browser) text(t *testing.T, css string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, bound)
	defer cancel()
	s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {textContent: ""}).textContent`, css)))
	return s
}

// value is the value of the form field that css selects.
func (b *browser) value(t *testing.T, css string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, bound)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Value(chromedp.CSS(css)))
	if err != nil {
		t.Fatalf("value of %s: %v", css, err)
	}
	return v
}

// waitText waits until the element that css selects holds want.
func (b *browser) waitText(t *testing.T, step, css, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, bound)
	defer cancel()
	js := fmt.Sprintf(`(document.querySelector(%q) || {textContent: ""}).textContent.includes(%q)`, css, want)
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](js, chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		t.Fatalf("%s: %s never showed %q: %v\nit shows: %s\npage says: %s", step, css, want, err, b.text(t, css), b.text(t, "#say"))
	}
}

// decide asks rls for a decision on user=v over gRPC.
func decide(t *testing.T, c rlsv3.RateLimitServiceClient, v string) rlsv3.RateLimitResponse_Code {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api",
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user", Value: v}}}}})
	if err != nil {
		t.Fatalf("ShouldRateLimit(user=%s): %v", v, err)
	}
	return resp.OverallCode
}

// TestOperatorPage drives the page as an operator would: it opens with no
// console error; without the token its views say so and an action is
// refused; with the token every view shows what rls holds (a limit spent
// by gRPC calls denied, its key in the top list); an override set in the
// page changes the next decision, deleting it restores the limit, a reset
// from the page frees the key; explain draws the path; the page fits a
// phone's width.
func TestOperatorPage(t *testing.T) {
	path := chromium(t)
	rls := startRLS(t)
	conn, err := grpc.NewClient(rls.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	b := startBrowser(t, path)
	page := "http://" + rls.httpAddr + "/ui/"

	b.do(t, "open the page", chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#token-form")))
	b.waitText(t, "no token", "#say", "need the admin token")
	b.waitText(t, "no token", `[data-part="limits"]`, "401")

	// Without the token an action is refused, and changes nothing.
	b.do(t, "override without the token",
		chromedp.SetValue(chromedp.CSS(`#override-form [name="domain"]`), "api"),
		chromedp.SetValue(chromedp.CSS(`#override-form [name="descriptor"]`), "user=mallory"),
		chromedp.SetValue(chromedp.CSS(`#override-form [name="requests_per_unit"]`), "1000"),
		chromedp.SetValue(chromedp.CSS(`#override-form [name="reason"]`), "no token"),
		chromedp.Click(chromedp.CSS(`#override-form button`)))
	b.waitText(t, "override without the token", "#say", "override refused: 401")

	// The token, typed in the page: every view comes.
	b.do(t, "type the token", chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#token-form button")))
	b.waitText(t, "with the token", `[data-part="limits"]`, "per_user")
	b.waitText(t, "with the token", `[data-part="limits"]`, "sliding_window")
	b.waitText(t, "with the token", `[data-part="reloads"]`, "added api per_user")
	b.waitText(t, "with the token", `[data-part="system"]`, "memory: answers")
	if s := b.text(t, `[data-part="overrides"]`); !strings.Contains(s, "No override") {
		t.Errorf("the override sent without the token was kept: %s", s)
	}

	// Two reloads: one that raises a limit, one that fails (the config
	// stays); the page shows both, the change and the error.
	for i, text := range []string{strings.Replace(limits, "requests_per_unit: 100,", "requests_per_unit: 200,", 1), limits + "  - key: [\n"} {
		if err := os.WriteFile(rls.configPath, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		rls.Reload("test")
		want := []string{"changed api tenant/plan=gold/1m: requests_per_unit: 100 → 200", "failed, the previous config stays"}[i]
		b.waitText(t, "reload", `[data-part="reloads"]`, want)
	}
	b.waitText(t, "reload", `[data-part="limits"]`, "200 / 1m")

	// An RLQS client (Envoy's quota filter): its stream and bucket show.
	quota, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := quota.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": "carol"}}, NumRequestsAllowed: 1}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := quota.Recv(); err != nil {
		t.Fatalf("the RLQS stream's first answer: %v", err)
	}
	b.waitText(t, "RLQS", `[data-part="system"]`, "user=carol")
	if s := b.text(t, `table.rlqs`); !strings.Contains(s, "per_user") {
		t.Errorf("the RLQS stream's bucket does not name its limit: %s", s)
	}

	// A limit spent by real calls: denied, with its key in the top list.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := decide(t, client, "alice"); got != want {
			t.Fatalf("call %d on user=alice = %v, want %v", i+1, got, want)
		}
	}
	b.waitText(t, "spent", `[data-part="top"]`, "user=alice")
	b.do(t, "spent: the limit's denials", chromedp.Poll[chromedp.Void](`!/^0\b/.test(document.querySelector('tr[data-label="per_user"] [data-f="denied"]').textContent)`))

	// An override set in the page changes the next decision.
	b.do(t, "override from the top list", chromedp.Click(chromedp.CSS(`[data-part="top"] button[data-act="override"][data-descriptor="user=alice"]`)))
	if got := b.value(t, `#override-form [name="descriptor"]`); got != "user=alice" {
		t.Errorf("Override… on user=alice's row filled the form's descriptor with %q", got)
	}
	b.do(t, "raise alice's limit",
		chromedp.SetValue(chromedp.CSS(`#override-form [name="requests_per_unit"]`), "10"),
		chromedp.SetValue(chromedp.CSS(`#override-form [name="ttl"]`), "1h"),
		chromedp.SetValue(chromedp.CSS(`#override-form [name="reason"]`), "support ticket 42"),
		chromedp.Click(chromedp.CSS(`#override-form button`)))
	b.waitText(t, "override set", "#say", "override saved: api user=alice → 10")
	b.waitText(t, "override set", `[data-part="overrides"]`, "support ticket 42")
	b.waitText(t, "override set", `[data-part="limits"]`, "user=alice → 10")
	if got := decide(t, client, "alice"); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("user=alice after the page raised the limit to 10 = %v, want OK", got)
	}

	// Explain draws the path through the tree, the override on the limit.
	b.do(t, "explain", chromedp.Click(chromedp.CSS(`[data-part="top"] button[data-act="explain"][data-request*='"alice"']`)))
	b.waitText(t, "explain", "#explain-out", "user=alice → node user")
	b.waitText(t, "explain", "#explain-out", "per_user: 10 per 1h")
	if shots := os.Getenv("RLS_UI_SHOTS"); shots != "" {
		traffic(t, client, 150)
		b.shots(t, shots)
	}

	// Expire…: the override gets an end, the rest of it kept.
	b.do(t, "expire the override", chromedp.Click(chromedp.CSS(`[data-part="overrides"] button[data-act="expire"]`)),
		chromedp.SetValue(chromedp.CSS(`#override-form [name="ttl"]`), "30m"), chromedp.Click(chromedp.CSS(`#override-form button`)))
	b.waitText(t, "override expiring", "#say", "override saved: api user=alice → 10")
	b.waitText(t, "override expiring", `[data-part="overrides"]`, "support ticket 42")
	if exp := overrideExpiry(t, rls.httpAddr); exp.IsZero() || time.Until(exp) > 31*time.Minute {
		t.Errorf("after Expire… with 30m the override expires at %v, want within 30 minutes", exp)
	}

	// Deleted, the configured limit applies again; a reset frees the key.
	b.do(t, "delete the override", chromedp.Click(chromedp.CSS(`[data-part="overrides"] button[data-act="delete"]`)))
	b.waitText(t, "override deleted", "#say", "override deleted")
	if got := decide(t, client, "alice"); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("user=alice after the override was deleted = %v, want OVER_LIMIT", got)
	}
	b.do(t, "reset from the top list", chromedp.Click(chromedp.CSS(`[data-part="top"] button[data-act="reset"][data-request*='"alice"']`)))
	b.waitText(t, "reset", "#say", "counters cleared")
	if got := decide(t, client, "alice"); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("user=alice after the page reset it = %v, want OK", got)
	}

	// The keyboard alone: Tab from the title reaches the views' links in
	// order, Enter follows one; the explain form is filled and sent with
	// keys.
	b.do(t, "keyboard", chromedp.Evaluate[chromedp.Void](`document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0)`),
		chromedp.Click(chromedp.CSS("h1")), chromedp.KeyEvent(kb.Tab), chromedp.KeyEvent(kb.Tab), chromedp.KeyEvent(kb.Tab))
	if got := b.text(t, ":focus"); got != "Explain" {
		t.Errorf("three Tabs from the title focus %q, want the link Explain", got)
	}
	b.do(t, "keyboard", chromedp.KeyEvent(kb.Enter),
		chromedp.Focus(chromedp.CSS(`#explain-form [name="descriptor"]`)), chromedp.KeyEvent("tenant=t1,plan=gold"), chromedp.KeyEvent(kb.Enter))
	b.waitText(t, "explain with the keyboard", "#explain-out", "tenant/plan=gold/1m")
	// The path is marked in the limits view: the node tenant and its
	// child plan=gold (two limits).
	ctxPath, cancelPath := context.WithTimeout(b.ctx, bound)
	marked, err := chromedp.Run(ctxPath, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("tr.on-path")).map(r => r.dataset.path)`))
	cancelPath()
	if err != nil || strings.Join(marked, "|") != "api tenant|api tenant/plan=gold|api tenant/plan=gold" {
		t.Errorf("rows marked on the path of tenant=t1,plan=gold: %q (%v), want the node tenant and the two limits of tenant/plan=gold", marked, err)
	}
	if hash, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.hash`)); hash != "#explain" {
		t.Errorf("Enter on the link Explain led to %q, want #explain", hash)
	}

	// A phone's width: the page itself does not scroll sideways (wide
	// tables scroll in their own box).
	b.do(t, "phone width", chromedp.EmulateViewport(390, 844))
	ctx, cancel := context.WithTimeout(b.ctx, bound)
	defer cancel()
	wide, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth + 1`))
	if err != nil || wide {
		over, _ := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("body *")).filter(e => e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX == "visible").map(e => e.tagName + "." + e.className + "#" + e.id)`))
		t.Errorf("at 390 px the page is wider than the screen (%v); elements overflowing: %v", err, over)
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.errs) > 0 {
		t.Errorf("the browser's console reported errors:\n%s", strings.Join(b.errs, "\n"))
	}
}

// overrideExpiry reads the expiry of the one override from
// GET /admin/overrides (zero when it has none).
func overrideExpiry(t *testing.T, httpAddr string) time.Time {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+httpAddr+"/admin/overrides", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Overrides []struct {
			ExpiresAt *time.Time `json:"expires_at"`
		} `json:"overrides"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Overrides) != 1 {
		t.Fatalf("GET /admin/overrides: %v, %d overrides, want 1", err, len(list.Overrides))
	}
	if e := list.Overrides[0].ExpiresAt; e != nil {
		return *e
	}
	return time.Time{}
}

// traffic makes n calls on a few keys, a tenth of a second apart, for
// the screenshots' sparklines.
func traffic(t *testing.T, c rlsv3.RateLimitServiceClient, n int) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for i := range n {
		<-tick.C
		decide(t, c, fmt.Sprintf("user%d", i%7))
	}
}

// shots writes a screenshot of each view into dir, as small PNGs: the
// views as they are, at 1280 px.
func (b *browser) shots(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Sparklines need three refreshes; the header stays at the top of
	// the page rather than over each view.
	b.do(t, "sparklines", chromedp.Poll[chromedp.Void](`document.querySelector('tr[data-label="per_user"] svg.spark polyline') !== null`))
	b.do(t, "header", chromedp.Evaluate[chromedp.Void](`document.querySelector("header").style.position = "static"`))
	for _, view := range []string{"limits", "top", "explain", "overrides", "reloads", "system"} {
		ctx, cancel := context.WithTimeout(b.ctx, bound)
		shot, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS("section#"+view), chromedp.NodeVisible))
		cancel()
		if err != nil {
			t.Fatalf("screenshot of %s: %v", view, err)
		}
		small, err := paletted(shot)
		if err != nil {
			t.Fatalf("screenshot of %s: %v", view, err)
		}
		if err := os.WriteFile(filepath.Join(dir, view+".png"), small, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// paletted re-encodes a PNG with a palette of 256 colours, which holds a
// page of text and flat colours at a fraction of the size.
func paletted(in []byte) ([]byte, error) {
	img, err := png.Decode(bytes.NewReader(in))
	if err != nil {
		return nil, err
	}
	pal := append(color.Palette{}, palette.WebSafe...)
	for g := 0; g < 256; g += 8 { // greys for antialiased text
		pal = append(pal, color.Gray{Y: uint8(g)})
	}
	out := image.NewPaletted(img.Bounds(), pal)
	draw.Draw(out, out.Rect, img, img.Bounds().Min, draw.Src)
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&buf, out); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
