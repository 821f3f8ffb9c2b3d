// Package ui is the operator page served at /ui/ (rls serve --ui): every
// domain's limit tree with live decisions, the top keys, the overrides,
// the last config loads, RLQS, leased slices and the store's health, with
// an explain form and reset and override actions.
//
// It is a client like any other: its server side reads the JSON endpoints
// (/debug/config, /debug/status, /debug/top) through the API's own handler,
// with the asking request's address and credentials, and renders them as
// HTML (the read views work without JavaScript); its script refreshes the
// views and acts through the same endpoints (/debug/explain,
// /admin/reset, /admin/overrides) with the token the operator types,
// sent in a header. It holds no rate-limit logic and knows nothing of the
// service, the engine or the stores.
package ui
