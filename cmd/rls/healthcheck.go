package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"
)

// healthcheck asks a readiness URL, for container health checks in an
// image that has no curl or wget.
func healthcheck(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("rls healthcheck", flag.ContinueOnError)
	if err := commandFlags("healthcheck", fs, args, stdout); err != nil {
		return helpIsSuccess(err)
	}
	url := "http://127.0.0.1:8080/readyz"
	switch fs.NArg() {
	case 0:
	case 1:
		url = fs.Arg(0)
	default:
		return usageError{errors.New("usage: rls healthcheck [URL]")}
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return usageError{err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, body)
	}
	fmt.Fprintf(stdout, "%s: %s", url, body)
	return nil
}
