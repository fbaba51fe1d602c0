package upstream

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// The connection to istiod carries every relayed stream, so its
// connection-level flow-control window is what all of them share: Dial
// opens it at ConnWindowSize (one WINDOW_UPDATE on stream 0 right after the
// preface), not at HTTP/2's 64 KiB, and keeps each stream's window at
// StreamWindowSize, static (a slow sidecar's stream holds at most that much
// unread data in Embark). The test reads what a real gRPC client dialed by
// Dial sends to a raw HTTP/2 listener.
func TestDialOpensLargeConnectionWindow(t *testing.T) {
	tests := []struct {
		name                 string
		opts                 Options
		wantConn, wantStream uint32
	}{
		{name: "defaults", wantConn: DefaultConnWindowSize, wantStream: DefaultStreamWindowSize},
		{name: "set", opts: Options{ConnWindowSize: 4 << 20, StreamWindowSize: 256 << 10}, wantConn: 4 << 20, wantStream: 256 << 10},
		{name: "HTTP/2's", opts: Options{ConnWindowSize: 65535}, wantConn: 65535, wantStream: DefaultStreamWindowSize},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = lis.Close() }()
			opts := tt.opts
			opts.Address, opts.Plaintext, opts.Logger = lis.Addr().String(), true, slog.New(slog.DiscardHandler)
			conn, err := Dial(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = conn.Close() }()
			stream, connWindow := readWindows(t, lis)
			if stream != tt.wantStream {
				t.Errorf("SETTINGS_INITIAL_WINDOW_SIZE %d, want %d", stream, tt.wantStream)
			}
			if connWindow != tt.wantConn {
				t.Errorf("connection window %d, want %d", connWindow, tt.wantConn)
			}
		})
	}
}

// readWindows accepts the client's connection on lis and reads its preface,
// SETTINGS and any WINDOW_UPDATE of stream 0 that follows before the
// client waits for the server: the stream window it announces and the
// connection window it opened.
func readWindows(t *testing.T, lis net.Listener) (stream, conn uint32) {
	t.Helper()
	c, err := lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(r, preface); err != nil || string(preface) != http2.ClientPreface {
		t.Fatalf("client preface %q: %v", preface, err)
	}
	fr := http2.NewFramer(c, r)
	stream, conn = 65535, 65535 // HTTP/2's initial windows
	// The client sends its SETTINGS, then (when its connection window is
	// larger than HTTP/2's) a WINDOW_UPDATE of stream 0; it then waits for
	// the server's SETTINGS, so a short read deadline ends the frames.
	for {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		f, err := fr.ReadFrame()
		if err != nil {
			return stream, conn
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				stream = v
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				conn += f.Increment
			}
		}
	}
}
