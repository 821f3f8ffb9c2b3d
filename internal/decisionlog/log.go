package decisionlog

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/service"
)

// Defaults of Options.
const (
	DefaultMaxBytes = 100 << 20
	DefaultBackups  = 3
	DefaultQueue    = 8192
)

// Options configure a Log.
type Options struct {
	// Path is the log's file ("-": Stdout). It is appended to; past
	// MaxBytes it is renamed Path.1 (Path.1 to Path.2, and so on, Backups
	// kept) and a new one started.
	Path   string
	Stdout io.Writer
	// MaxBytes bounds one file (0: DefaultMaxBytes); Backups is how many
	// rotated files are kept (0 keeps none: a full file is started over;
	// negative: DefaultBackups).
	MaxBytes int64
	Backups  int
	// Sample is the share of keys whose decisions are kept, all of them
	// (0 < Sample ≤ 1; 0 means 1).
	Sample float64
	// HashKey, when not empty, replaces every descriptor value that the
	// config does not name exactly by a keyed hash (HMAC-SHA256).
	HashKey []byte
	// Queue bounds the records waiting for the writer (0: DefaultQueue);
	// past it a record is dropped and counted.
	Queue int
	// Switches are the server's, written in the headers for replays.
	Switches Switches
	// Now reads the instant of each record: the store's clock where it is
	// not Redis's. nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Stats are a log's counters since it started.
type Stats struct {
	Written uint64 // decisions and resets written
	Dropped uint64 // records dropped because the queue was full
	Failed  uint64 // records lost to a failed write
	Bytes   uint64 // written, headers included
	Rotated uint64 // files rotated
}

// Log is a decision log: a service.Observer that encodes each decision
// and reset it keeps and queues it for its writer (Start, Close). Safe for
// concurrent use.
type Log struct {
	opts      Options
	now       func() time.Time
	threshold uint64 // keep a key whose hash is below; MaxUint64 with Sample 1
	all       bool   // Sample 1: every record kept
	hash      *hasher
	queue     chan queued
	bufs      sync.Pool // *[]byte
	log       *slog.Logger
	failLog   rate.Sometimes

	out     *output
	done    chan struct{} // closed by Close: the writer drains the queue and returns
	stopped chan struct{} // closed when the writer has returned

	mu              sync.Mutex // guards started, closed and closeErr
	started, closed bool
	closeErr        error

	written, dropped, failed, bytes, rotated atomic.Uint64
}

var _ service.Observer = (*Log)(nil)

// queued is a record waiting for the writer, with the config it was made
// on (for the header that comes before it).
type queued struct {
	buf *[]byte
	cfg *logConfig
}

// New opens the log of opts (the file is created or appended to). The
// writer starts with Start; Close flushes and closes.
func New(opts Options) (*Log, error) {
	if opts.Sample == 0 {
		opts.Sample = 1
	}
	if opts.Sample < 0 || opts.Sample > 1 || math.IsNaN(opts.Sample) {
		return nil, fmt.Errorf("decision log: sample %v is not in (0, 1]", opts.Sample)
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Backups < 0 {
		opts.Backups = DefaultBackups
	}
	if opts.Queue <= 0 {
		opts.Queue = DefaultQueue
	}
	l := &Log{opts: opts, now: opts.Now, log: opts.Logger, queue: make(chan queued, opts.Queue),
		done: make(chan struct{}), stopped: make(chan struct{}), failLog: rate.Sometimes{Interval: 10 * time.Second}}
	if l.now == nil {
		l.now = time.Now
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.all = opts.Sample >= 1
	l.threshold = math.MaxUint64
	if !l.all {
		l.threshold = uint64(opts.Sample * (1 << 64))
	}
	if len(opts.HashKey) > 0 {
		l.hash = newHasher(opts.HashKey)
	}
	l.bufs.New = func() any { b := make([]byte, 0, 1024); return &b }
	var err error
	if l.out, err = openOutput(opts, &l.rotated); err != nil {
		return nil, err
	}
	return l, nil
}

// Start starts the writer, once; Close stops it. A Start after Close
// starts nothing.
func (l *Log) Start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.started && !l.closed {
		l.started = true
		go l.write()
	}
}

// Close stops the writer once it has written what is queued, flushes and
// closes the file, and returns the error of closing it. Records made
// after it are dropped. Idempotent; without Start it only closes.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.closeErr
	}
	l.closed = true
	close(l.done)
	if l.started {
		<-l.stopped
	}
	l.closeErr = l.out.close()
	return l.closeErr
}

// Stats returns the log's counters.
func (l *Log) Stats() Stats {
	return Stats{Written: l.written.Load(), Dropped: l.dropped.Load(), Failed: l.failed.Load(), Bytes: l.bytes.Load(), Rotated: l.rotated.Load()}
}

// logConfig is what ForConfig makes of a config: its version and files.
type logConfig struct {
	version string
	files   []string
}

// ConfigVersion is the version of cfg that a log names: 12 hex digits of
// the SHA-256 of its JSON dump (what /debug/config shows: every domain,
// node and limit with the files and places they come from).
func ConfigVersion(cfg *config.Config) string {
	h := sha256.New()
	cfg.WriteJSON(h, math.MaxInt)
	return hex.EncodeToString(h.Sum(nil)[:6])
}

// ForConfig implements service.Observer: the config's version.
func (l *Log) ForConfig(cfg *config.Config) any {
	return &logConfig{version: ConfigVersion(cfg), files: cfg.Files()}
}

// Reloaded implements service.Observer: nothing to do.
func (l *Log) Reloaded(error) {}

// Decided implements service.Observer: the decision's record, when its
// keys are kept, is queued (dropped and counted when the queue is full).
func (l *Log) Decided(state any, d *service.Decision) {
	lc, _ := state.(*logConfig)
	var keep [service.MaxDescriptors]bool // by descriptor: its key is kept
	if !l.keeps(d.Request, d.Items, d.Owners, keep[:]) {
		return
	}
	if len(l.queue) == cap(l.queue) {
		l.dropped.Add(1) // full: not worth encoding
		return
	}
	buf := l.bufs.Get().(*[]byte)
	*buf = l.appendDecision((*buf)[:0], lc, d, keep[:])
	l.enqueue(buf, lc)
}

// Cleared implements service.Observer: a reset's record (as a decision's).
func (l *Log) Cleared(state any, c *service.Cleared) {
	lc, _ := state.(*logConfig)
	var keep [service.MaxDescriptors]bool
	if c.Request == nil || !l.keeps(c.Request, c.Items, c.Owners, keep[:]) {
		return
	}
	buf := l.bufs.Get().(*[]byte)
	*buf = l.appendReset((*buf)[:0], lc, c, keep[:])
	l.enqueue(buf, lc)
}

// enqueue queues buf for the writer, or drops it when the queue is full
// or the log closed.
func (l *Log) enqueue(buf *[]byte, lc *logConfig) {
	select {
	case <-l.done:
		l.putBuf(buf)
		return
	default:
	}
	select {
	case l.queue <- queued{buf, lc}:
	default:
		l.dropped.Add(1)
		l.putBuf(buf)
	}
}

func (l *Log) putBuf(buf *[]byte) {
	if cap(*buf) <= 64<<10 {
		l.bufs.Put(buf)
	}
}

// keeps reports whether a request's record is kept, and sets keep[i] for
// each descriptor i whose key is kept (items are what the store judged,
// owners[j] the descriptor of items[j]). Every record is kept at Sample
// 1. Otherwise a descriptor's key is kept by the hash of its counters'
// identity, the same in every process; a request is kept when one of its
// keys is; a request with no limit by the hash of its first descriptor.
func (l *Log) keeps(req *service.Request, items []engineItem, owners []int, keep []bool) bool {
	if l.all {
		for i := range req.Descriptors {
			keep[i] = true
		}
		return true
	}
	kept := false
	for j := range items {
		i := owners[j]
		if j > 0 && owners[j-1] == i {
			continue
		}
		if sampleHash(items[j].Desc) < l.threshold {
			keep[i], kept = true, true
		}
	}
	if len(items) == 0 && len(req.Descriptors) > 0 {
		h := uint64(fnvOffset)
		h = fnvString(h, req.Domain)
		for _, e := range req.Descriptors[0].Entries {
			h = fnvString(fnvString(h, e.Key), e.Value)
		}
		if mix(h) < l.threshold {
			keep[0], kept = true, true
		}
	}
	return kept
}

// write is the writer: it writes what is queued, a header before each
// file's first record and before a record of another config, and flushes
// whenever the queue is empty, until Close; then it writes what is left.
//
// Under load it writes in batches: after a batch it lets records gather
// for gatherFor before it takes the next, so that a decision does not wake
// it for each record (waking a goroutine costs the decision more than its
// record). Idle, it waits for the next record.
func (l *Log) write() {
	defer close(l.stopped)
	pause := time.NewTimer(0)
	<-pause.C
	for {
		select {
		case q := <-l.queue:
			l.writeOne(q)
			l.drain()
			l.flush()
		case <-l.done:
			l.drain()
			l.flush()
			return
		}
		pause.Reset(gatherFor)
		select {
		case <-pause.C:
		case <-l.done:
			pause.Stop()
			l.drain()
			l.flush()
			return
		}
	}
}

// gatherFor is how long the writer lets records gather after a batch.
const gatherFor = time.Millisecond

// drain writes the records queued now, without waiting for more.
func (l *Log) drain() {
	for {
		select {
		case q := <-l.queue:
			l.writeOne(q)
		default:
			return
		}
	}
}

// writeOne writes a record, in a new file when it would take the file
// past its bound, after a header when the file has none of its config.
func (l *Log) writeOne(q queued) {
	var head []byte
	if q.cfg != nil && q.cfg != l.out.header {
		head = l.headerLine(q.cfg)
	}
	if l.out.full(len(head) + len(*q.buf)) {
		if err := l.out.rotate(); err != nil {
			l.writeFailed(err)
		}
		if q.cfg != nil && head == nil {
			head = l.headerLine(q.cfg)
		}
	}
	if head != nil {
		if err := l.out.write(head, &l.bytes); err != nil {
			l.writeFailed(err)
		}
		l.out.header = q.cfg
	}
	if err := l.out.write(*q.buf, &l.bytes); err != nil {
		l.failed.Add(1)
		l.writeFailed(err)
	} else {
		l.written.Add(1)
	}
	l.putBuf(q.buf)
}

func (l *Log) flush() {
	if err := l.out.flush(); err != nil {
		l.writeFailed(err)
	}
}

func (l *Log) writeFailed(err error) {
	l.failLog.Do(func() { l.log.Warn("decision log: write failed; records are lost", "path", l.opts.Path, "error", err) })
}

// headerLine is the header of the config lc.
func (l *Log) headerLine(lc *logConfig) []byte {
	b := []byte(`{"log":`)
	b = appendString(b, HeaderTag)
	b = append(b, `,"v":`...)
	b = appendUint(b, FormatVersion)
	b = append(b, `,"time":`...)
	b = appendTime(b, l.now())
	b = append(b, `,"config":`...)
	b = appendString(b, lc.version)
	b = append(b, `,"files":[`...)
	for i, f := range lc.files {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, f) // paths of a loaded config: UTF-8 in practice
	}
	b = append(b, `],"sample":`...)
	b = appendFloat(b, l.opts.Sample)
	b = append(b, `,"hashed":`...)
	b = appendBool(b, l.hash != nil)
	sw := l.opts.Switches
	b = append(b, `,"count_denied_hits":`...)
	b = appendBool(b, sw.CountDeniedHits)
	b = append(b, `,"shadow":`...)
	b = appendBool(b, sw.Shadow)
	b = append(b, `,"quota_all":`...)
	b = appendBool(b, sw.QuotaAll)
	return append(b, "}\n"...)
}

// output is where the writer writes: a file it rotates, or stdout. Used by
// the writer alone.
type output struct {
	path     string
	maxBytes int64
	backups  int
	stdout   bool
	file     io.WriteCloser // nil for stdout
	w        *bufio.Writer
	size     int64
	rotated  *atomic.Uint64
	header   *logConfig // the config of the last header in this file
}

// openOutput opens the output of opts.
func openOutput(opts Options, rotated *atomic.Uint64) (*output, error) {
	o := &output{path: opts.Path, maxBytes: opts.MaxBytes, backups: opts.Backups, rotated: rotated}
	if opts.Path == "-" {
		if opts.Stdout == nil {
			return nil, errors.New("decision log: - (stdout) without a stdout")
		}
		o.w, o.stdout = bufio.NewWriterSize(opts.Stdout, 64<<10), true
		return o, nil
	}
	if err := o.open(); err != nil {
		return nil, err
	}
	return o, nil
}
