// Producer produces the lines of stdin to a topic, one record per line, up to 100 records per
// request.
//
//	printf 'hello\nworld\n' | MQGW_URL=http://127.0.0.1:8080 go run ./producer demo
//
// It prints where each record went, one JSON line each ({"partition":4,"offset":0}, or
// {"error":{...}} for a record the broker refused), and exits 1 if any record failed.
// Environment: MQGW_URL (default http://127.0.0.1:8080), MQGW_API_KEY (sent as a bearer token),
// MQGW_PRODUCER (the producer name, needed when a key is bound to several). Standard library only.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"time"
)

const batchSize = 100

var client = &http.Client{Timeout: 30 * time.Second}

type record struct {
	Value string `json:"value"`
}

type request struct {
	Topic    string   `json:"topic"`
	Producer string   `json:"producer,omitempty"`
	Messages []record `json:"messages"`
}

// produce sends one batch. A 503 is retried after its Retry-After: a resend may write a record
// twice, which an at-least-once consumer must tolerate anyway.
func produce(topic string, values []string) ([]json.RawMessage, error) {
	req := request{Topic: topic, Producer: os.Getenv("MQGW_PRODUCER")}
	for _, v := range values {
		req.Messages = append(req.Messages, record{Value: v})
	}
	data, _ := json.Marshal(req)
	for attempt := 1; ; attempt++ {
		httpReq, _ := http.NewRequest(http.MethodPost, baseURL()+"/produce", bytes.NewReader(data))
		httpReq.Header.Set("Content-Type", "application/json")
		if key := os.Getenv("MQGW_API_KEY"); key != "" {
			httpReq.Header.Set("Authorization", "Bearer "+key)
		}
		r, err := client.Do(httpReq)
		if err != nil {
			return nil, err
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode == http.StatusServiceUnavailable && attempt < 5 {
			seconds, err := strconv.Atoi(r.Header.Get("Retry-After"))
			if err != nil {
				seconds = 1
			}
			time.Sleep(time.Duration(seconds) * time.Second)
			continue
		}
		if r.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("produce: %d %s", r.StatusCode, body)
		}
		var answer struct {
			Results []json.RawMessage `json:"results"`
		}
		err = json.Unmarshal(body, &answer)
		return answer.Results, err
	}
}

func baseURL() string {
	if u := os.Getenv("MQGW_URL"); u != "" {
		return u
	}
	return "http://127.0.0.1:8080"
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: producer TOPIC  (records: the lines of stdin)")
		os.Exit(2)
	}
	var lines []string
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<20) // records up to 1 MiB
	for scanner.Scan() {
		lines = append(lines, scanner.Text())
	}
	failed := 0
	for i := 0; i < len(lines); i += batchSize {
		end := i + batchSize
		if end > len(lines) {
			end = len(lines)
		}
		results, err := produce(os.Args[1], lines[i:end])
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
	}
	if failed > 0 {
		os.Exit(1)
	}
}
