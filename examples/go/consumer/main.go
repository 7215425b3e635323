// Consumer is a consumer loop: fetch a batch, handle it, ack it with the next fetch.
//
//	MQGW_URL=http://127.0.0.1:8080 go run ./consumer orders-svc demo
//
// What it shows:
//   - Long poll: each fetch waits up to MQGW_WAIT_MS (default 10000) for records.
//   - Piggy-backed ack: the requestId of the handled batch rides on the next fetch.
//   - 429 (consumer rate limit): wait retryAfterMs; 503: wait Retry-After seconds.
//   - A handler that fails hands the batch back with /unlock: it is fetched again at once.
//   - SIGTERM or Ctrl-C: the current fetch finishes, the handled batch is acked and an
//     unhandled one unlocked, and the program exits 0.
//
// Environment: MQGW_URL, MQGW_API_KEY (bearer token), MQGW_CLIENT_ID (broadcast mode: every
// clientId gets every record), MQGW_FAIL_ONCE (a value whose first handling fails, to watch the
// unlock). Each handled record is printed as one JSON line. Standard library only.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

var (
	baseURL  = envOr("MQGW_URL", "http://127.0.0.1:8080")
	apiKey   = os.Getenv("MQGW_API_KEY")
	waitMs   = envOr("MQGW_WAIT_MS", "10000")
	failOnce = os.Getenv("MQGW_FAIL_ONCE")
	failed   = map[string]bool{}
	client   = &http.Client{Timeout: 60 * time.Second} // more than the longest long poll (30 s)
)

// message is one record of a /message answer (utf8 encoding: strings, or null).
type message struct {
	Offset int64   `json:"offset"`
	Key    *string `json:"key"`
	Value  *string `json:"value"`
}

// batch is a /message answer, 200 or 429.
type batch struct {
	Status       string    `json:"status"`
	RequestID    string    `json:"requestId"`
	Queue        string    `json:"queue"`
	Messages     []message `json:"messages"`
	RetryAfterMs int64     `json:"retryAfterMs"`
	Ack          *struct {
		Result string `json:"result"`
	} `json:"ack"`
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// handle is the application's work. Delivery is at-least-once, so it must tolerate a record twice.
func handle(queue string, m message) error {
	if m.Value != nil && *m.Value == failOnce && !failed[failOnce] {
		failed[failOnce] = true
		return fmt.Errorf("cannot handle %q (MQGW_FAIL_ONCE)", *m.Value)
	}
	line, _ := json.Marshal(map[string]any{"queue": queue, "offset": m.Offset, "key": m.Key, "value": m.Value})
	fmt.Println(string(line))
	return nil
}

func handleAll(b batch) error {
	for _, m := range b.Messages {
		if err := handle(b.Queue, m); err != nil {
			return err
		}
	}
	return nil
}

func post(path string, body any) (*http.Response, error) {
	data, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, baseURL+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	return client.Do(req)
}

// fetch is GET /message with the parameters in the query string.
func fetch(params url.Values) (*http.Response, error) {
	req, _ := http.NewRequest(http.MethodGet, baseURL+"/message?"+params.Encode(), nil)
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	return client.Do(req)
}

// settle sends an ack or an unlock and drains the answer, so the connection can be reused.
// If an unlock fails, the lock simply expires after its timeout.
func settle(path, requestID string) {
	r, err := post(path, map[string]string{"requestId": requestID})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s failed: %v\n", path, err)
		return
	}
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
}

func run(consumer, topic string) int {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, os.Interrupt)
	stop := make(chan struct{})
	go func() { <-signals; close(stop) }()
	stopping := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	params := url.Values{"consumer": {consumer}, "topic": {topic}, "wait_ms": {waitMs}}
	if id := os.Getenv("MQGW_CLIENT_ID"); id != "" {
		params.Set("clientId", id)
	}
	pending := "" // requestId of the handled batch, acked by the next fetch
	for !stopping() {
		if pending != "" {
			params.Set("requestId", pending)
		} else {
			params.Del("requestId")
		}
		r, err := fetch(params)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gateway unreachable (%v); retrying in 1 s\n", err)
			time.Sleep(time.Second)
			continue
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode == http.StatusServiceUnavailable { // the ack may not have run: keep it pending
			seconds, err := strconv.Atoi(r.Header.Get("Retry-After"))
			if err != nil {
				seconds = 1
			}
			time.Sleep(time.Duration(seconds) * time.Second)
			continue
		}
		if r.StatusCode != http.StatusOK && r.StatusCode != http.StatusTooManyRequests {
			fmt.Fprintf(os.Stderr, "%d %s\n", r.StatusCode, body)
			return 1
		}
		var b batch
		if err := json.Unmarshal(body, &b); err != nil {
			fmt.Fprintf(os.Stderr, "bad answer: %v\n", err)
			return 1
		}
		pending = "" // the piggy-backed ack ran, whatever came back
		if b.Ack != nil && b.Ack.Result != "committed" && b.Ack.Result != "already_committed" {
			fmt.Fprintf(os.Stderr, "ack: %s: the batch will be redelivered\n", b.Ack.Result)
		}
		switch {
		case r.StatusCode == http.StatusTooManyRequests:
			time.Sleep(time.Duration(b.RetryAfterMs) * time.Millisecond)
			continue
		case b.Status == "paused": // answered at once, not long-polled
			time.Sleep(time.Second)
			continue
		case b.Status != "ok": // empty: the long poll ran out
			continue
		}
		if stopping() { // fetched but not handled: let another client have it now
			settle("/unlock", b.RequestID)
			break
		}
		if err := handleAll(b); err != nil {
			fmt.Fprintf(os.Stderr, "handler failed (%v); batch unlocked\n", err)
			settle("/unlock", b.RequestID)
			continue
		}
		pending = b.RequestID
	}
	if pending != "" {
		settle("/ack", pending)
	}
	return 0
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: consumer CONSUMER TOPIC")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1], os.Args[2]))
}
