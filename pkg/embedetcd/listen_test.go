package embedetcd

import (
	"net/url"
	"testing"
)

func TestListenURL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		tls  bool
		want string
	}{
		{"https://127.0.0.1:2380", true, "https://127.0.0.1:2380"},
		{"https://[::1]:2380", true, "https://[::1]:2380"},
		{"https://10.0.0.7:2380", true, "https://10.0.0.7:2380"},
		{"https://h1:2380", true, "https://0.0.0.0:2380"},
		{"https://h1.example.com:12380", true, "https://0.0.0.0:12380"},
		{"https://localhost:2379", true, "https://127.0.0.1:2379"},
		{"https://LocalHost:2379", true, "https://127.0.0.1:2379"},
		{"http://h1:2380", false, "http://h1:2380"}, // no TLS: not opened to every address
		{"https://h1", true, "https://h1"},          // no port: left to etcd's error
	} {
		u, err := url.Parse(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := listenURL(u, tc.tls).String(); got != tc.want {
			t.Errorf("listenURL(%s, tls=%v) = %s, want %s", tc.in, tc.tls, got, tc.want)
		}
	}
}
