package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxTokenFileBytes bounds the admin token file.
const maxTokenFileBytes = 4096

// DefaultTokenCheckEvery is how often Watch reads the token file again.
const DefaultTokenCheckEvery = time.Second

// tokenProblemEvery bounds the log of a token file problem that lasts: it
// is logged when it appears, then at most once per this interval.
const tokenProblemEvery = time.Minute

// errNoToken: the file holds nothing (empty, or only blank lines).
var errNoToken = errors.New("no token in it (want one non-empty line)")

// ParseToken returns the token of a token file's content: its one
// non-empty line, without the white space around it (a trailing newline,
// blank lines around it). Empty content, a second non-empty line, or more
// than 4096 bytes is an error. rls's server and its client commands read a
// token file with it, so that both take the same token from it.
func ParseToken(b []byte) ([]byte, error) {
	if len(b) > maxTokenFileBytes {
		return nil, fmt.Errorf("more than %d bytes", maxTokenFileBytes)
	}
	var token []byte
	for n, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if token != nil {
			return nil, fmt.Errorf("line %d: a second non-empty line (want one line: the token)", n+1)
		}
		token = line
	}
	if token == nil {
		return nil, errNoToken
	}
	return token, nil
}

// ReadTokenFile reads the token of the file at path (see ParseToken).
// Errors name the file.
func ReadTokenFile(path string) ([]byte, error) {
	_, token, err := readTokenFile(path)
	return token, err
}

// readTokenFile reads the file at path and returns its content and its
// token.
func readTokenFile(path string) (content, token []byte, err error) {
	if content, err = readBounded(path); err != nil {
		return nil, nil, err
	}
	if token, err = ParseToken(content); err != nil {
		return nil, nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return content, token, nil
}

// readBounded reads at most one byte more than maxTokenFileBytes of path,
// so that a huge file (or a device) costs nothing.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return b, nil
}

// TokenFile is the bearer token kept in a file (--admin-token-file): its
// one non-empty line. NewTokenFile reads it; Watch reads it again on a
// timer and takes a changed token by the file's content (a hash of it),
// whatever its modification time and size say, so that a rotation applies
// within a tick. Requests never touch the file: they are compared with the
// token last read. Safe for concurrent use.
//
// A file that goes missing, cannot be read or is emptied refuses every
// token until it is mended; a file whose content is not a token (a second
// line, too large) keeps the token read before. Either is logged as an
// error when it appears, then at most once a minute while it lasts. A file
// that its group or others may read or write is warned about once.
type TokenFile struct {
	path string
	log  *slog.Logger
	// sum is the SHA-256 of the token in force; nil refuses every token.
	sum atomic.Pointer[[sha256.Size]byte]

	mu          sync.Mutex // guards what follows
	content     [sha256.Size]byte
	read        bool // content is the hash of the file as last read
	problem     string
	problemAt   time.Time
	warnedPerms bool
}

// NewTokenFile reads the token of the file at path; a missing or
// unreadable file, or one that holds no single token, is an error. log
// (nil: none) receives the file's problems and rotations.
func NewTokenFile(path string, log *slog.Logger) (*TokenFile, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b, token, err := readTokenFile(path)
	if err != nil {
		return nil, err
	}
	t := &TokenFile{path: path, log: log}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.take(sha256.Sum256(b), token)
	t.checkPerms()
	return t, nil
}

// valid reports whether got is the token in force, in a time that depends
// neither on the token nor on got's likeness to it (their hashes are
// compared). False when no token is in force.
func (t *TokenFile) valid(got string) bool {
	want := t.sum.Load()
	if want == nil || got == "" {
		return false
	}
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
}

// Watch reads the file again every interval (DefaultTokenCheckEvery when
// not positive) until ctx ends.
func (t *TokenFile) Watch(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultTokenCheckEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			t.Check(now)
		}
	}
}

// Check reads the file again and takes its token when its content
// changed; now bounds how often a lasting problem is logged.
func (t *TokenFile) Check(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, err := readBounded(t.path)
	if err != nil {
		t.sum.Store(nil)
		t.read = false
		t.report(now, err.Error()+"; requests that need the token are refused")
		return
	}
	t.checkPerms()
	sum := sha256.Sum256(b)
	if t.read && sum == t.content {
		t.report(now, t.problem) // the same content: its problem, if any, lasts
		return
	}
	t.content, t.read = sum, true
	token, err := ParseToken(b)
	switch {
	case errors.Is(err, errNoToken):
		t.sum.Store(nil)
		t.report(now, fmt.Sprintf("token file %s: %v; requests that need the token are refused", t.path, err))
		return
	case err != nil:
		t.report(now, fmt.Sprintf("token file %s: %v; the token read before stays in force", t.path, err))
		return
	}
	had := t.sum.Load() != nil
	t.take(sum, token)
	t.report(now, "")
	if had {
		t.log.Info("admin token file: a new token is in force", "file", t.path)
	} else {
		t.log.Info("admin token file: a token is in force again", "file", t.path)
	}
}

// take puts token in force, read from a file whose content hashes to
// content. Requires t.mu held.
func (t *TokenFile) take(content [sha256.Size]byte, token []byte) {
	t.content, t.read = content, true
	sum := sha256.Sum256(token)
	t.sum.Store(&sum)
}

// report logs problem ("" when there is none) when it is new, or when the
// last log of it is tokenProblemEvery old at now. Requires t.mu held.
func (t *TokenFile) report(now time.Time, problem string) {
	switch {
	case problem == "":
	case problem != t.problem, !now.Before(t.problemAt.Add(tokenProblemEvery)):
		t.log.Error("admin token file: " + problem)
		t.problemAt = now
	}
	t.problem = problem
}

// checkPerms warns, once, when the file's group or others may read or
// write it. Requires t.mu held.
func (t *TokenFile) checkPerms() {
	if t.warnedPerms {
		return
	}
	fi, err := os.Stat(t.path)
	if err != nil || fi.Mode().Perm()&0o066 == 0 {
		return
	}
	t.warnedPerms = true
	t.log.Warn("admin token file: its group or others may read or write it; chmod 600 it", "file", t.path, "mode", fi.Mode().Perm().String())
}

// bearer returns the token of an Authorization header that carries the
// Bearer scheme, in any case (RFC 7235: the scheme is case-insensitive),
// and whether it does.
func bearer(header string) (string, bool) {
	scheme, rest, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token := strings.TrimSpace(rest)
	return token, token != ""
}
