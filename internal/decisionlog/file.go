package decisionlog

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
)

// open opens the log's file for appending.
func (o *output) open() error {
	f, err := os.OpenFile(o.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("decision log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("decision log: %w", err)
	}
	o.file, o.size, o.header = f, st.Size(), nil
	if o.w == nil {
		o.w = bufio.NewWriterSize(f, 64<<10)
	} else {
		o.w.Reset(f)
	}
	return nil
}

// full reports whether n more bytes would take the file past its bound
// (a file holds at least one record).
func (o *output) full(n int) bool {
	return o.file != nil && o.size > 0 && o.size+int64(n) > o.maxBytes
}

// write writes a line; bytes counts what is written.
func (o *output) write(line []byte, bytes *atomic.Uint64) error {
	if o.file == nil && !o.stdout {
		if err := o.open(); err != nil { // a rotation that failed to open
			return err
		}
	}
	n, err := o.w.Write(line)
	o.size += int64(n)
	bytes.Add(uint64(n))
	return err
}

// rotate closes the file, shifts the rotated ones (PATH.1 to PATH.2 ...,
// the oldest beyond backups removed), renames it PATH.1 and opens a new
// one. With no backups the file is started over.
func (o *output) rotate() error {
	if err := o.w.Flush(); err != nil {
		return err
	}
	if err := o.file.Close(); err != nil {
		return err
	}
	o.file = nil
	name := func(i int) string { return o.path + "." + strconv.Itoa(i) }
	var err error
	if o.backups == 0 {
		err = os.Remove(o.path)
	} else {
		os.Remove(name(o.backups))
		for i := o.backups - 1; i >= 1; i-- {
			if e := os.Rename(name(i), name(i+1)); e != nil && !errors.Is(e, os.ErrNotExist) {
				err = e
			}
		}
		err = errors.Join(err, os.Rename(o.path, name(1)))
	}
	o.rotated.Add(1)
	if e := o.open(); e != nil {
		return errors.Join(err, e)
	}
	if err != nil {
		return fmt.Errorf("decision log: rotating: %w", err)
	}
	return nil
}

func (o *output) flush() error { return o.w.Flush() }

// close flushes and closes the file (not stdout).
func (o *output) close() error {
	if o.file == nil && !o.stdout {
		return nil
	}
	err := o.w.Flush()
	if o.file != nil {
		err = errors.Join(err, o.file.Close())
		o.file = nil
	}
	return err
}
