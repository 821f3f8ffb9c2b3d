package overrides

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rlsproject/rls/internal/config"
)

// Backend keeps the overrides where every process that shares the
// counters finds them: records (an override as encode writes it) by ID,
// and a version that every change increments. Redis keeps them beside the
// counters (internal/redisstore); the memory store in this process
// (Memory). Its methods are safe for concurrent use.
type Backend interface {
	// Load returns every record and the version they are at.
	Load(ctx context.Context) (records map[string][]byte, version uint64, err error)
	// Get returns the record of id, nil when there is none.
	Get(ctx context.Context, id string) ([]byte, error)
	// Poll returns the version and the store's clock.
	Poll(ctx context.Context) (version uint64, now time.Time, err error)
	// Put keeps rec at id and returns the record it replaced (nil for
	// none) and the version of the change.
	Put(ctx context.Context, id string, rec []byte) (prev []byte, version uint64, err error)
	// Delete removes the record of id and returns it, with the version of
	// the change; nil and 0 when there was none (nothing changed).
	Delete(ctx context.Context, id string) (prev []byte, version uint64, err error)
	// Purge removes the record of id if it is still rec (an expired
	// override) and returns the version of the change, 0 when it did not.
	Purge(ctx context.Context, id string, rec []byte) (version uint64, err error)
	// Watch calls notice with each change that other processes announce
	// (its version and ID) until ctx ends or the subscription fails, which
	// it returns; subscribed is called each time the subscription is
	// confirmed (changes before it were not announced to it). A backend
	// that no other process shares returns nil when ctx ends.
	Watch(ctx context.Context, notice func(version uint64, id string), subscribed func()) error
}

// Errors of Set and Delete.
var (
	// ErrNotFound: Delete found no override with that key.
	ErrNotFound = errors.New("no such override")
	// ErrFull: Set would keep more than Options.Max overrides.
	ErrFull = errors.New("too many overrides")
)

// RefusedError is an override that the loaded config refuses: it matches
// no limit, or its values do not fit a limit it matches.
type RefusedError struct{ Msg string }

func (e *RefusedError) Error() string { return e.Msg }

// Options configure a Keeper.
type Options struct {
	// Now, when set, is the clock that expiries are read by, instead of
	// the store's (Backend.Poll) read through this process's clock: a
	// test's, rls test's virtual one.
	Now func() time.Time
	// Poll is how often the version is checked against the store's, to
	// catch changes whose notice was missed (default 500ms).
	Poll time.Duration
	// Max bounds the overrides kept (default 1,000,000).
	Max    int
	Logger *slog.Logger
}

// DefaultPoll is Options.Poll's default: with a notice on every change,
// every process applies a change within a second even when its notice is
// lost.
const DefaultPoll = 500 * time.Millisecond

// Keeper keeps the overrides of a Backend: it checks changes against the
// loaded config, applies them to the tables (its own at once, other
// processes' when announced or when a poll finds the version moved),
// expires them at their instant by the store's clock, and keeps the last
// copy it read when the backend cannot be read. Safe for concurrent use;
// Run follows the backend until its context ends.
type Keeper struct {
	backend Backend
	opts    Options
	log     *slog.Logger
	table   atomic.Pointer[Table]
	offset  atomic.Int64 // the store's clock less this process's, ns
	wake    chan struct{}

	// syncMu orders the reads of the backend and what they change: one
	// sync (a change made here, notices, a poll, a purge) at a time.
	syncMu sync.Mutex

	mu      sync.Mutex // guards what follows
	cfg     *config.Config
	records map[string]*Override
	raw     map[string][]byte // the records as stored, by ID
	// entries are what cfg makes of the records not expired (the current
	// table indexes those that apply).
	entries map[string]*entry
	version uint64
	loaded  bool // a Load succeeded: version and records are the store's
	stale   error
	since   time.Time // when stale began
	changes map[change]uint64
	syncErr uint64
}

// change is a metric series of changes: a domain and an operation.
type change struct{ domain, op string }

// New returns a keeper of b's overrides. It holds none until Load (or
// Run) reads them.
func New(b Backend, opts Options) *Keeper {
	if opts.Poll <= 0 {
		opts.Poll = DefaultPoll
	}
	if opts.Max <= 0 {
		opts.Max = 1_000_000
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Keeper{backend: b, opts: opts, log: opts.Logger, wake: make(chan struct{}, 1),
		records: make(map[string]*Override), raw: make(map[string][]byte), entries: make(map[string]*entry), changes: make(map[change]uint64)}
}

// now reads the clock of expiries.
func (k *Keeper) now() time.Time {
	if k.opts.Now != nil {
		return k.opts.Now()
	}
	return time.Now().Add(time.Duration(k.offset.Load()))
}

// Bind makes cfg the config the overrides apply to (the service calls it
// before cfg becomes current): its table is built and current; the
// previous config's stays for the decisions still on it.
func (k *Keeper) Bind(cfg *config.Config) {
	k.mu.Lock()
	defer k.mu.Unlock()
	old := k.table.Load()
	prev := old
	if old != nil && old.cfg == cfg {
		prev = old.prev
	}
	k.cfg = cfg
	k.entries = newEntries(cfg, k.records, k.entries, k.now())
	k.table.Store(buildTable(cfg, k.entries, prev))
}

// Table returns the table of cfg, the current config or the one before:
// nil when there is none (no override, or cfg is neither). An expiry due
// by now is applied first. It does not allocate but to expire.
func (k *Keeper) Table(cfg *config.Config) *Table {
	t := k.table.Load()
	if t == nil {
		return nil
	}
	if t.cfg != cfg {
		if t.prev != nil && t.prev.cfg == cfg {
			return t.prev
		}
		return nil
	}
	if t.expires != 0 && k.now().UnixMicro() >= t.expires {
		return k.expire(cfg)
	}
	return t
}

// expire removes from the table of cfg what expired by now, and asks Run
// to purge it from the backend.
func (k *Keeper) expire(cfg *config.Config) *Table {
	k.mu.Lock()
	defer k.mu.Unlock()
	t := k.table.Load()
	now := k.now()
	if t.cfg != cfg || t.expires == 0 || now.UnixMicro() < t.expires {
		return t
	}
	nt := t.changed(nil, nil, 0) // a copy: t stays as published
	for id, e := range k.entries {
		if expired(e.o, now) {
			delete(k.entries, id)
			nt = nt.changed(e, nil, 0)
			k.changes[change{e.o.Domain, "expire"}]++
			k.log.Info("override expired", "override", e.o.Key.String(), "expires_at", e.o.ExpiresAt, "requests_per_unit", e.o.RequestsPerUnit)
		}
	}
	nt.expires = earliest(k.entries)
	k.table.Store(nt)
	select {
	case k.wake <- struct{}{}:
	default:
	}
	return nt
}

// rebuild makes the entries and the table again from the records.
// Requires k.mu.
func (k *Keeper) rebuild() {
	if k.cfg == nil {
		return
	}
	var prev *Table
	if old := k.table.Load(); old != nil {
		prev = old.prev
	}
	k.entries = newEntries(k.cfg, k.records, k.entries, k.now())
	k.table.Store(buildTable(k.cfg, k.entries, prev))
}

// update applies the change of the record of id (k.records[id], nil when
// removed) to the entries and the table. Requires k.mu.
func (k *Keeper) update(id string) {
	t := k.table.Load()
	if k.cfg == nil || t == nil || t.cfg != k.cfg {
		k.rebuild()
		return
	}
	old := k.entries[id]
	var e *entry
	if o := k.records[id]; o != nil && !expired(o, k.now()) {
		e = newEntry(k.cfg, o)
		k.entries[id] = e
	} else {
		delete(k.entries, id)
	}
	expires := t.expires
	switch {
	case old != nil && !old.o.ExpiresAt.IsZero() && old.o.ExpiresAt.UnixMicro() == expires:
		expires = earliest(k.entries) // the earliest went
	case e != nil && !e.o.ExpiresAt.IsZero() && (expires == 0 || e.o.ExpiresAt.UnixMicro() < expires):
		expires = e.o.ExpiresAt.UnixMicro()
	}
	k.table.Store(t.changed(old, e, expires))
}

// Load reads every override of the backend and applies them: at start,
// and whenever the version says a change was missed. On error the copy
// held stays, marked stale.
func (k *Keeper) Load(ctx context.Context) error {
	k.syncMu.Lock()
	defer k.syncMu.Unlock()
	return k.load(ctx)
}

// load is Load. Requires k.syncMu.
func (k *Keeper) load(ctx context.Context) error {
	recs, version, err := k.backend.Load(ctx)
	if err != nil {
		k.failed(fmt.Errorf("reading the overrides: %w", err))
		return err
	}
	records := make(map[string]*Override, len(recs))
	for id, rec := range recs {
		o, err := decode(rec)
		if err != nil {
			k.log.Warn("override left out", "id", id, "error", err)
			continue
		}
		records[id] = o
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	// Overrides that did not change keep their values (and the table's
	// entries for them).
	for id := range records {
		if old := k.records[id]; old != nil && string(k.raw[id]) == string(recs[id]) {
			records[id] = old
		}
	}
	k.records, k.raw, k.version, k.loaded = records, recs, version, true
	k.rebuild()
	k.ok()
	return nil
}

// apply applies the change of version v to id, whose record is now rec
// (nil: deleted), when it is the next version; an older one is already
// applied; a later one means changes were missed: everything is read
// again. Requires k.syncMu.
func (k *Keeper) apply(ctx context.Context, v uint64, id string, rec []byte) error {
	k.mu.Lock()
	switch {
	case k.loaded && v <= k.version:
		k.mu.Unlock()
		return nil
	case !k.loaded || v != k.version+1:
		k.mu.Unlock()
		return k.load(ctx)
	}
	defer k.mu.Unlock()
	k.version = v
	if rec == nil {
		delete(k.records, id)
		delete(k.raw, id)
	} else if o, err := decode(rec); err != nil {
		k.log.Warn("override left out", "id", id, "error", err)
		delete(k.records, id)
		delete(k.raw, id)
	} else {
		k.records[id], k.raw[id] = o, rec
	}
	k.update(id)
	return nil
}

// failed marks the copy held stale: the backend could not be read.
func (k *Keeper) failed(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stale == nil {
		k.since = time.Now()
		k.log.Warn("overrides: the store cannot be read; deciding with the last copy read", "overrides", len(k.records), "version", k.version, "error", err)
	}
	k.stale = err
	k.syncErr++
}

// ok clears the stale mark. Requires k.mu.
func (k *Keeper) ok() {
	if k.stale != nil {
		k.log.Info("overrides: the store is read again", "stale_for", time.Since(k.since).Round(time.Millisecond), "overrides", len(k.records), "version", k.version)
	}
	k.stale = nil
}

// Set checks c against the loaded config and keeps it, at the store's
// clock (its expiry, when it has a ttl); who says who asked, for the log.
// It returns the override kept, as listed, once this process applies it.
// An override the config refuses is a *RefusedError.
func (k *Keeper) Set(ctx context.Context, c Change, who string) (Listed, error) {
	if err := c.Key.check(); err != nil {
		return Listed{}, err
	}
	now, err := k.storeNow(ctx)
	if err != nil {
		return Listed{}, err
	}
	o := &Override{Key: c.Key, RequestsPerUnit: c.RequestsPerUnit, Burst: c.Burst, Reason: c.Reason, UpdatedAt: now, UpdatedBy: who}
	if c.TTL > 0 {
		o.ExpiresAt = now.Add(c.TTL)
	}
	id := c.Key.ID()
	k.mu.Lock()
	cfg, n, exists := k.cfg, len(k.records), k.records[id] != nil
	k.mu.Unlock()
	if cfg == nil {
		return Listed{}, &RefusedError{Msg: "no config is loaded"}
	}
	e := newEntry(cfg, o)
	switch {
	case len(e.limits) == 0:
		return Listed{}, &RefusedError{Msg: "the override matches no limit of the loaded config: " + e.why + problemsText(e.problems)}
	case len(e.problems) > 0:
		return Listed{}, &RefusedError{Msg: "the override does not fit the limits it matches: " + joinProblems(e.problems)}
	case !exists && n >= k.opts.Max:
		return Listed{}, fmt.Errorf("%w: %d kept, at most %d", ErrFull, n, k.opts.Max)
	}
	rec := encode(o)
	prevRec, v, err := k.backend.Put(ctx, id, rec)
	if err != nil {
		return Listed{}, fmt.Errorf("storing the override: %w", err)
	}
	k.syncMu.Lock()
	err = k.apply(ctx, v, id, rec)
	k.syncMu.Unlock()
	k.count(o.Domain, "set")
	k.logChange("override set", who, c.Key, prevRec, o, e)
	if err != nil {
		k.log.Warn("overrides: the override is stored, but the others could not be read; the next poll tries again", "error", err)
	}
	return e.listed(), nil
}

// Delete removes the override of key; who says who asked. It returns the
// override removed, or ErrNotFound.
func (k *Keeper) Delete(ctx context.Context, key Key, who string) (JSON, error) {
	if err := key.check(); err != nil {
		return JSON{}, err
	}
	id := key.ID()
	prevRec, v, err := k.backend.Delete(ctx, id)
	if err != nil {
		return JSON{}, fmt.Errorf("deleting the override: %w", err)
	}
	if prevRec == nil {
		return JSON{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	k.syncMu.Lock()
	err = k.apply(ctx, v, id, nil)
	k.syncMu.Unlock()
	k.count(key.Domain, "delete")
	k.logChange("override deleted", who, key, prevRec, nil, nil)
	if err != nil {
		k.log.Warn("overrides: the override is deleted, but the others could not be read; the next poll tries again", "error", err)
	}
	prev, derr := decode(prevRec)
	if derr != nil {
		return JSON{Domain: key.Domain, Descriptor: entriesJSON(key.Descriptor), Name: key.Name}, nil
	}
	return prev.ToJSON(), nil
}

// storeNow reads the store's clock (this process's with Options.Now).
func (k *Keeper) storeNow(ctx context.Context) (time.Time, error) {
	if k.opts.Now != nil {
		return k.opts.Now(), nil
	}
	_, now, err := k.backend.Poll(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading the store's clock: %w", err)
	}
	k.offset.Store(int64(time.Until(now)))
	return now, nil
}

func (k *Keeper) count(domain, op string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.changes[change{domain, op}]++
}

// logChange logs a change made here: who, what, before → after.
func (k *Keeper) logChange(msg, who string, key Key, prevRec []byte, after *Override, e *entry) {
	attrs := []any{"by", who, "override", key.String()}
	if prevRec != nil {
		if p, err := decode(prevRec); err == nil {
			attrs = append(attrs, "before", valuesText(p))
		}
	} else {
		attrs = append(attrs, "before", "none")
	}
	if after != nil {
		attrs = append(attrs, "after", valuesText(after))
		if after.Reason != "" {
			attrs = append(attrs, "reason", after.Reason)
		}
		if e != nil {
			attrs = append(attrs, "limits", labels(e.limits))
		}
	} else {
		attrs = append(attrs, "after", "none")
	}
	k.log.Info(msg, attrs...)
}

// valuesText is what an override sets: "requests_per_unit=500 burst=50
// expires_at=…".
func valuesText(o *Override) string {
	s := fmt.Sprintf("requests_per_unit=%d", o.RequestsPerUnit)
	if o.Burst.Set {
		s += fmt.Sprintf(" burst=%d", o.Burst.V)
	}
	if !o.ExpiresAt.IsZero() {
		s += " expires_at=" + o.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return s
}

func problemsText(problems []string) string {
	if len(problems) == 0 {
		return ""
	}
	return "; " + joinProblems(problems)
}

func joinProblems(problems []string) string {
	s := ""
	for i, p := range problems {
		if i > 0 {
			s += "; "
		}
		s += p
	}
	return s
}

// List returns the overrides not expired, of domain (every domain when
// ""), as the loaded config sees them: by domain, then descriptor, then
// name.
func (k *Keeper) List(domain string) []Listed {
	now := k.now()
	out := []Listed{}
	k.mu.Lock()
	for _, e := range k.entries {
		if (domain == "" || e.o.Domain == domain) && !expired(e.o, now) {
			out = append(out, e.listed())
		}
	}
	k.mu.Unlock()
	slices.SortFunc(out, func(a, b Listed) int {
		return cmp.Or(cmp.Compare(a.Domain, b.Domain), slices.CompareFunc(a.Descriptor, b.Descriptor, func(x, y EntryJSON) int {
			return cmp.Or(cmp.Compare(x.Key, y.Key), cmp.Compare(x.Value, y.Value))
		}), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// Status is what a keeper knows of its backend.
type Status struct {
	// Stale is the last error reading the backend, nil when the last read
	// succeeded; Since is when the reads began to fail.
	Stale error
	Since time.Time
	// Version is the version of the copy held, Count its overrides.
	Version uint64
	Count   int
}

// Status returns what the keeper knows of its backend.
func (k *Keeper) Status() Status {
	k.mu.Lock()
	defer k.mu.Unlock()
	return Status{Stale: k.stale, Since: k.since, Version: k.version, Count: len(k.records)}
}

// notice is a change announced by the backend; resync (no ID) asks for a
// poll: the subscription was (re)confirmed.
type notice struct {
	version uint64
	id      string
	resync  bool
}

// Run follows the backend until ctx ends: it reads everything first, then
// applies the changes announced (Backend.Watch), polls the version every
// Options.Poll to catch a missed one, and removes expired overrides from
// the backend. It returns when ctx ends, with the watcher it started.
func (k *Keeper) Run(ctx context.Context) {
	notices := make(chan notice, 256)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { k.watch(ctx, notices) })
	k.Load(ctx)
	tick := time.NewTicker(k.opts.Poll)
	defer tick.Stop()
	for {
		var purge <-chan time.Time
		var timer *time.Timer
		if t := k.table.Load(); t != nil && t.expires != 0 {
			timer = time.NewTimer(k.until(time.UnixMicro(t.expires)))
			purge = timer.C
		}
		select {
		case <-ctx.Done():
		case n := <-notices:
			k.follow(ctx, n, notices)
		case <-tick.C:
			k.poll(ctx)
		case <-purge:
			k.purge(ctx)
		case <-k.wake:
			k.purge(ctx)
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// until is the time on this process's clock until the instant at of the
// clock of expiries.
func (k *Keeper) until(at time.Time) time.Duration {
	if k.opts.Now != nil {
		return at.Sub(k.opts.Now())
	}
	return time.Until(at.Add(-time.Duration(k.offset.Load())))
}

// watch keeps the backend's subscription until ctx ends, handing its
// notices to Run (a full queue is dropped: the poll then finds the
// version moved). Failures back off from 200ms to 5s.
func (k *Keeper) watch(ctx context.Context, notices chan<- notice) {
	wait, warned := 200*time.Millisecond, false
	for ctx.Err() == nil {
		err := k.backend.Watch(ctx,
			func(v uint64, id string) {
				select {
				case notices <- notice{version: v, id: id}:
				default:
				}
			},
			func() {
				wait, warned = 200*time.Millisecond, false
				select {
				case notices <- notice{resync: true}:
				default:
				}
			})
		if ctx.Err() != nil || err == nil {
			return
		}
		if !warned {
			k.log.Warn("overrides: the subscription to their changes failed; polling meanwhile", "error", err)
			warned = true
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// follow applies n and the notices queued behind it.
func (k *Keeper) follow(ctx context.Context, n notice, more <-chan notice) {
	k.syncMu.Lock()
	defer k.syncMu.Unlock()
	for {
		k.mu.Lock()
		applied := k.loaded && n.version <= k.version // this process's own change, mostly
		k.mu.Unlock()
		switch {
		case n.resync:
			k.pollLocked(ctx)
		case applied:
		default:
			rec, err := k.backend.Get(ctx, n.id)
			if err != nil {
				k.failed(fmt.Errorf("reading an override: %w", err))
			} else {
				k.apply(ctx, n.version, n.id, rec)
			}
		}
		select {
		case n = <-more:
		default:
			return
		}
	}
}

// poll checks the version, and reads everything again when it moved.
func (k *Keeper) poll(ctx context.Context) {
	k.syncMu.Lock()
	defer k.syncMu.Unlock()
	k.pollLocked(ctx)
}

// pollLocked is poll. Requires k.syncMu.
func (k *Keeper) pollLocked(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, k.opts.Poll)
	v, now, err := k.backend.Poll(pctx)
	cancel()
	if err != nil {
		k.failed(fmt.Errorf("reading the overrides' version: %w", err))
		return
	}
	k.offset.Store(int64(time.Until(now)))
	k.mu.Lock()
	current := k.loaded && v == k.version
	if current {
		k.ok()
	}
	k.mu.Unlock()
	if !current {
		k.load(ctx) // bounded by the backend (a Redis read of many overrides takes its time)
	}
}

// purge removes from the backend the overrides expired by now (each
// process tries; the backend removes each once).
func (k *Keeper) purge(ctx context.Context) {
	k.syncMu.Lock()
	defer k.syncMu.Unlock()
	now := k.now()
	type expired struct {
		id  string
		rec []byte
		o   *Override
	}
	var due []expired
	k.mu.Lock()
	for id, o := range k.records {
		if !o.ExpiresAt.IsZero() && !now.Before(o.ExpiresAt) {
			due = append(due, expired{id, k.raw[id], o})
		}
	}
	k.mu.Unlock()
	for _, d := range due {
		v, err := k.backend.Purge(ctx, d.id, d.rec)
		if err != nil {
			k.failed(fmt.Errorf("removing an expired override: %w", err))
			return
		}
		if v != 0 {
			k.log.Info("expired override removed from the store", "override", d.o.Key.String(), "expires_at", d.o.ExpiresAt)
			k.apply(ctx, v, d.id, nil)
		}
	}
	// The table itself dropped them at their instant (Table).
	if t := k.table.Load(); t != nil && t.expires != 0 && now.UnixMicro() >= t.expires {
		k.expire(t.cfg)
	}
}
