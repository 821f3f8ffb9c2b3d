package overrides

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Memory is the Backend of the memory store: the overrides of this
// process, and no other's. With a file, they survive a restart: the file
// is written whole at each change, atomically (a temporary file in the
// same directory, synced, renamed over it), and read at start. Its clock
// is the process's. Safe for concurrent use.
type Memory struct {
	path string
	now  func() time.Time

	mu      sync.Mutex
	records map[string][]byte
	version uint64
}

var _ Backend = (*Memory)(nil)

// fileJSON is the file of a Memory backend.
type fileJSON struct {
	Version   uint64            `json:"version"`
	Overrides []json.RawMessage `json:"overrides"`
}

// NewMemory returns a memory backend, kept in the file at path when path
// is not "" (read now when it exists; a file that cannot be read or is
// not one of these is an error, naming the path); now is its clock (nil:
// time.Now).
func NewMemory(path string, now func() time.Time) (*Memory, error) {
	if now == nil {
		now = time.Now
	}
	m := &Memory{path: path, now: now, records: make(map[string][]byte)}
	if path == "" {
		return m, nil
	}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return m, nil
	case err != nil:
		return nil, err
	}
	var f fileJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("%s: not an overrides file: %w", path, err)
	}
	for i, raw := range f.Overrides {
		o, err := decode(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: overrides[%d]: %w", path, i, err)
		}
		m.records[o.ID()] = encode(o)
	}
	m.version = f.Version
	return m, nil
}

// Load implements Backend.
func (m *Memory) Load(context.Context) (map[string][]byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.records), m.version, nil
}

// Get implements Backend.
func (m *Memory) Get(_ context.Context, id string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.records[id], nil
}

// Poll implements Backend.
func (m *Memory) Poll(context.Context) (uint64, time.Time, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version, m.now(), nil
}

// Put implements Backend.
func (m *Memory) Put(_ context.Context, id string, rec []byte) ([]byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, had := m.records[id]
	m.records[id] = rec
	if err := m.save(m.version + 1); err != nil {
		if had {
			m.records[id] = prev
		} else {
			delete(m.records, id)
		}
		return nil, 0, err
	}
	m.version++
	return prev, m.version, nil
}

// Delete implements Backend.
func (m *Memory) Delete(_ context.Context, id string) ([]byte, uint64, error) {
	return m.remove(id, nil)
}

// Purge implements Backend.
func (m *Memory) Purge(_ context.Context, id string, rec []byte) (uint64, error) {
	_, v, err := m.remove(id, rec)
	return v, err
}

// remove deletes id (when its record is rec, unless rec is nil).
func (m *Memory) remove(id string, rec []byte) ([]byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, had := m.records[id]
	if !had || rec != nil && !bytes.Equal(prev, rec) {
		return nil, 0, nil
	}
	delete(m.records, id)
	if err := m.save(m.version + 1); err != nil {
		m.records[id] = prev
		return nil, 0, err
	}
	m.version++
	return prev, m.version, nil
}

// Watch implements Backend: no other process changes them.
func (m *Memory) Watch(ctx context.Context, _ func(uint64, string), subscribed func()) error {
	subscribed()
	<-ctx.Done()
	return nil
}

// save writes the file, at version, when there is one. Requires m.mu.
func (m *Memory) save(version uint64) error {
	if m.path == "" {
		return nil
	}
	f := fileJSON{Version: version, Overrides: []json.RawMessage{}}
	for _, id := range slices.Sorted(maps.Keys(m.records)) {
		f.Overrides = append(f.Overrides, m.records[id])
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomically(m.path, append(data, '\n'))
}

// writeAtomically replaces the file at path with data: a reader finds the
// old file or the new one, whole, even across a crash.
func writeAtomically(path string, data []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing the overrides file: %w", err)
	}
	defer os.Remove(tmp.Name()) // once renamed, nothing is left to remove
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("writing the overrides file %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // the rename itself, where the file system allows
		d.Close()
	}
	return nil
}
