// Producer produces the lines of stdin to a topic, one record per line, as they come.
//
//	printf 'hello\nworld\n' | MQGW_URL=http://127.0.0.1:8080 go run ./producer demo
//	tail -f app.log | go run ./producer demo
//
// A batch goes out when it holds 100 lines, or MQGW_LINGER_MS (default 200) after its first line
// was read, or when stdin ends; on Ctrl-C (or SIGTERM) the lines read and not yet sent are sent
// before it exits (130, or 143). So a pipe that stays open is sent as it flows.
//
// It prints where each record went, one JSON line each ({"partition":4,"offset":0}, or
// {"error":{...}} for a record the broker refused), and exits 1 if any record failed.
// Environment: MQGW_URL (default http://127.0.0.1:8080), MQGW_API_KEY (sent as a bearer token),
// MQGW_PRODUCER (the producer name, needed when a key is bound to several). Standard library only.
//
// A gateway that cannot be reached (not started yet, restarting, a network error) or answers
// 502/503/504 is retried until it answers, with capped exponential backoff: 0.5 s, 1 s, 2 s, ...
// up to 10 s between tries, each wait jittered (a random 50-100 %) so that many producers do not
// come back in step; a Retry-After longer than that is honoured. Each retry says why on stderr.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	batchSize  = 100
	firstRetry = 500 * time.Millisecond
	maxRetry   = 10 * time.Second
)

var client = &http.Client{Timeout: 30 * time.Second}

// stopped is the exit code a stop signal asked for (0: none yet).
var stopped int32

type record struct {
	Value string `json:"value"`
}

type request struct {
	Topic    string   `json:"topic"`
	Producer string   `json:"producer,omitempty"`
	Messages []record `json:"messages"`
}

// post sends until the gateway gives an answer that is not "try again" (see the top), and
// returns its status and body. A resend may write a record twice (the first try may have been
// written before the connection broke), which an at-least-once consumer must tolerate anyway.
func post(path string, data []byte) (int, []byte) {
	for backoff := firstRetry; ; backoff *= 2 {
		if backoff > maxRetry {
			backoff = maxRetry
		}
		var wait time.Duration
		var why string
		httpReq, _ := http.NewRequest(http.MethodPost, baseURL()+path, bytes.NewReader(data))
		httpReq.Header.Set("Content-Type", "application/json")
		if key := os.Getenv("MQGW_API_KEY"); key != "" {
			httpReq.Header.Set("Authorization", "Bearer "+key)
		}
		r, err := client.Do(httpReq)
		if err != nil { // refused, reset, timed out, no such host
			why = fmt.Sprintf("gateway unreachable at %s (%v)", baseURL(), err)
		} else {
			body, err := io.ReadAll(r.Body)
			r.Body.Close()
			switch {
			case err != nil:
				why = fmt.Sprintf("gateway unreachable at %s (%v)", baseURL(), err)
			case r.StatusCode != http.StatusBadGateway && r.StatusCode != http.StatusServiceUnavailable &&
				r.StatusCode != http.StatusGatewayTimeout:
				return r.StatusCode, body
			default:
				if seconds, err := strconv.Atoi(r.Header.Get("Retry-After")); err == nil {
					wait = time.Duration(seconds) * time.Second
				}
				why = fmt.Sprintf("gateway answered %d", r.StatusCode)
			}
		}
		if jittered := time.Duration(float64(backoff) * (0.5 + rand.Float64()/2)); jittered > wait {
			wait = jittered
		}
		fmt.Fprintf(os.Stderr, "producer: %s; retrying in %.1f s\n", why, wait.Seconds())
		for end := time.Now().Add(wait); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if atomic.LoadInt32(&stopped) != 0 {
				fmt.Fprintln(os.Stderr, "producer: stopped while the gateway was away; this batch was not sent")
				os.Exit(1)
			}
		}
	}
}

// produce sends one batch, retried while the gateway is away (post).
func produce(topic string, values []string) ([]json.RawMessage, error) {
	req := request{Topic: topic, Producer: os.Getenv("MQGW_PRODUCER")}
	for _, v := range values {
		req.Messages = append(req.Messages, record{Value: v})
	}
	data, _ := json.Marshal(req)
	status, body := post("/produce", data)
	if status != http.StatusOK {
		return nil, fmt.Errorf("produce: %d %s", status, body)
	}
	var answer struct {
		Results []json.RawMessage `json:"results"`
	}
	err := json.Unmarshal(body, &answer)
	return answer.Results, err
}

func baseURL() string {
	if u := os.Getenv("MQGW_URL"); u != "" {
		return u
	}
	return "http://127.0.0.1:8080"
}

func lingerTime() time.Duration {
	if ms, err := strconv.Atoi(os.Getenv("MQGW_LINGER_MS")); err == nil {
		return time.Duration(ms) * time.Millisecond
	}
	return 200 * time.Millisecond
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: producer TOPIC  (records: the lines of stdin)")
		os.Exit(2)
	}
	// The lines, read by a goroutine of their own as they come; closed at the end of stdin.
	lines := make(chan string, batchSize)
	go func() {
		scanner := bufio.NewScanner(os.Stdin)
		scanner.Buffer(make([]byte, 1<<20), 1<<20) // records up to 1 MiB
		for scanner.Scan() {
			lines <- scanner.Text()
		}
		close(lines)
	}()
	// A stop is noted at once (a batch being retried while the gateway is away sees it) and
	// then handled by the loop below, between batches.
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	stop := make(chan struct{})
	go func() {
		code := int32(130)
		if <-signals == syscall.SIGTERM {
			code = 143
		}
		atomic.StoreInt32(&stopped, code)
		close(stop)
	}()

	failed := 0
	var batch []string
	send := func() {
		for len(batch) > 0 {
			n := len(batch)
			if n > batchSize {
				n = batchSize
			}
			results, err := produce(os.Args[1], batch[:n])
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			for _, result := range results {
				var r struct {
					Error json.RawMessage `json:"error"`
				}
				if json.Unmarshal(result, &r) == nil && r.Error != nil {
					failed++
				}
				fmt.Println(string(result))
			}
			batch = batch[n:]
		}
	}
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	for {
		select {
		case line, ok := <-lines:
			if !ok { // the end of stdin
				send()
				if failed > 0 {
					os.Exit(1)
				}
				return
			}
			batch = append(batch, line)
			if len(batch) >= batchSize {
				send()
			} else if len(batch) == 1 {
				linger.Reset(lingerTime())
			}
		case <-linger.C:
			send()
		case <-stop:
			for drained := false; !drained; { // lines the reader already passed on
				select {
				case line, ok := <-lines:
					if ok {
						batch = append(batch, line)
					} else {
						drained = true
					}
				default:
					drained = true
				}
			}
			send()
			os.Exit(int(atomic.LoadInt32(&stopped)))
		}
	}
}
