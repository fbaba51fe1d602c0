package relay

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The benchmark's ADS clients run in a process of their own (this test
// binary again, with clientsEnv naming their spec): a held stream is a
// connection on each side, and holding 10,000 streams with both ends in one
// process takes more file descriptors than a usual limit (20,000 here). It
// also leaves this process's heap to Embark alone on the relayed side.
//
// The parent talks to the client process with one JSON line each way per
// command (clientCommand, clientReply) on its stdin and stdout.
const clientsEnv = "EMBARK_RELAY_BENCH_CLIENTS"

// clientSpec is what the client process holds streams to.
type clientSpec struct {
	Addr       string         `json:"addr"`
	ServerName string         `json:"serverName"`
	RootsPEM   []byte         `json:"rootsPEM"`
	PerConn    int            `json:"perConn"`
	Streams    []streamClient `json:"streams"`
}

// streamClient is one workload's stream: its token and node ID.
type streamClient struct {
	Token  string `json:"token"`
	NodeID string `json:"nodeID"`
}

// clientCommand is a command to the client process: "latencies" (subscribe
// every stream to RDS 9080 and time the answers), "arm" (from now on,
// record when each stream ACKs a CDS response of at least MinClusters
// clusters), "wait-push" (wait until every stream has) or "quit".
type clientCommand struct {
	Op          string `json:"op"`
	MinClusters int    `json:"minClusters,omitempty"`
}

// clientReply is the client process's answer; its first line, once every
// stream is held, carries the memory figures.
type clientReply struct {
	Err string `json:"err,omitempty"`
	// Base and Held are the client process's memory before the streams
	// were opened and once they are held.
	Base *memory `json:"base,omitempty"`
	Held *memory `json:"held,omitempty"`
	// Latencies are the RDS answers' times, sorted.
	Latencies []time.Duration `json:"latencies,omitempty"`
	// LastACK is when the last stream ACKed the large CDS response (Unix
	// nanoseconds); CDSBytes the largest such response's encoded size.
	LastACK  int64 `json:"lastACK,omitempty"`
	CDSBytes int   `json:"cdsBytes,omitempty"`
}

// clientProcess is the parent's handle on a running client process.
type clientProcess struct {
	cmd *exec.Cmd
	in  *json.Encoder
	out *bufio.Scanner
}

// startClients starts the client process holding spec's streams and
// returns once they are all held (CDS and LDS ACKed), with its memory
// before and after.
func startClients(spec clientSpec) (*clientProcess, clientReply, error) {
	f, err := os.CreateTemp("", "relay-clients-*.json")
	if err != nil {
		return nil, clientReply{}, err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	if err := json.NewEncoder(f).Encode(spec); err != nil {
		return nil, clientReply{}, err
	}
	if err := f.Close(); err != nil {
		return nil, clientReply{}, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, clientReply{}, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), clientsEnv+"="+f.Name())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, clientReply{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, clientReply{}, err
	}
	if err := cmd.Start(); err != nil {
		return nil, clientReply{}, fmt.Errorf("start the client process: %w", err)
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	p := &clientProcess{cmd: cmd, in: json.NewEncoder(stdin), out: sc}
	r, err := p.reply()
	if err != nil {
		p.close()
		return nil, r, err
	}
	return p, r, nil
}

// do sends c and returns the reply.
func (p *clientProcess) do(c clientCommand) (clientReply, error) {
	if err := p.in.Encode(c); err != nil {
		return clientReply{}, fmt.Errorf("client process: %w", err)
	}
	return p.reply()
}

func (p *clientProcess) reply() (clientReply, error) {
	var r clientReply
	if !p.out.Scan() {
		return r, fmt.Errorf("client process ended: %w", errors.Join(p.out.Err(), io.ErrUnexpectedEOF))
	}
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		return r, fmt.Errorf("client process reply %q: %w", p.out.Text(), err)
	}
	if r.Err != "" {
		return r, errors.New(r.Err)
	}
	return r, nil
}

// close ends the client process (its streams close with it).
func (p *clientProcess) close() {
	_ = p.in.Encode(clientCommand{Op: "quit"})
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// runClients is the client process's main: it holds the spec's streams
// and answers commands on stdin until "quit" or the end of stdin.
func runClients(specFile string) int {
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(clientReply{Err: err.Error()})
		return 1
	}
	data, err := os.ReadFile(specFile)
	if err != nil {
		return fail(err)
	}
	var spec clientSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fail(err)
	}
	base := heap()
	h, err := holdStreams(spec)
	if err != nil {
		return fail(err)
	}
	defer h.close()
	held := steadyHeap()
	if err := out.Encode(clientReply{Base: &base, Held: &held}); err != nil {
		return 1
	}
	in := json.NewDecoder(os.Stdin)
	for {
		var c clientCommand
		if err := in.Decode(&c); err != nil || c.Op == "quit" {
			return 0
		}
		var r clientReply
		switch c.Op {
		case "latencies":
			r.Latencies, err = latencies(h)
		case "arm":
			h.arm(c.MinClusters)
		case "wait-push":
			r.LastACK, r.CDSBytes, err = h.waitPush(10 * time.Minute)
		default:
			err = fmt.Errorf("unknown command %q", c.Op)
		}
		if err != nil {
			r = clientReply{Err: err.Error()}
		}
		if err := out.Encode(r); err != nil {
			return 1
		}
	}
}

// held is the clients' side of the held streams.
type held struct {
	streams []*heldStream
	close   func()
	// minClusters, once armed, is the size of the large CDS response
	// each stream records the ACK of.
	minClusters atomic.Int64
}

// heldStream is one held stream read all the time, as a sidecar reads its
// stream: pushes (istiod pushes when Embark writes the WorkloadEntries'
// connection annotations) are ACKed and never pile up in the client's
// receive buffers.
type heldStream struct {
	h      *held
	mu     sync.Mutex // serialises Send
	st     discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	routes chan *discovery.DiscoveryResponse
	failed chan error
	// pushACK is when the stream ACKed the large CDS response (Unix
	// nanoseconds, 0 until then), pushBytes that response's size.
	pushACK, pushBytes atomic.Int64
}

func (h *heldStream) send(req *discovery.DiscoveryRequest) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st.Send(req)
}

// read ACKs every response, records the ACK of the large CDS response and
// hands RDS responses to latencies.
func (h *heldStream) read() {
	for {
		resp, err := h.st.Recv()
		if err == nil {
			err = h.send(&discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
		}
		if err != nil {
			h.failed <- err
			return
		}
		switch resp.GetTypeUrl() {
		case resource.ClusterType:
			if least := h.h.minClusters.Load(); least > 0 && int64(len(resp.GetResources())) >= least && h.pushACK.Load() == 0 {
				h.pushBytes.Store(int64(proto.Size(resp)))
				h.pushACK.Store(time.Now().UnixNano())
			}
		case resource.RouteType:
			select {
			case h.routes <- resp:
			default:
			}
		}
	}
}

// arm makes every stream record when it ACKs a CDS response of at least
// minClusters clusters.
func (h *held) arm(minClusters int) {
	for _, s := range h.streams {
		s.pushACK.Store(0)
	}
	h.minClusters.Store(int64(minClusters))
}

// waitPush waits until every stream ACKed the large CDS response and
// returns the last ACK's time and the largest response's size.
func (h *held) waitPush(timeout time.Duration) (int64, int, error) {
	deadline := time.Now().Add(timeout)
	for {
		var last, size int64
		waiting := 0
		for _, s := range h.streams {
			select {
			case err := <-s.failed:
				return 0, 0, fmt.Errorf("a stream ended during the push: %w", err)
			default:
			}
			t := s.pushACK.Load()
			if t == 0 {
				waiting++
			}
			last, size = max(last, t), max(size, s.pushBytes.Load())
		}
		if waiting == 0 {
			return last, int(size), nil
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("%d of %d streams had not ACKed the pushed configuration after %s", waiting, len(h.streams), timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sidecarNode(id string) *core.Node {
	return &core.Node{Id: id, Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PROXY_CONFIG":    structpb.NewStructValue(&structpb.Struct{}),
		"ISTIO_VERSION":   structpb.NewStringValue("1.30.0"),
		"SERVICE_ACCOUNT": structpb.NewStringValue("ratings-vm"),
		"LABELS":          structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"app": structpb.NewStringValue("ratings")}}),
	}}}
}

// holdStreams opens one SotW stream per workload of spec (spec.PerConn
// streams per client connection), subscribes to CDS and LDS and ACKs both.
func holdStreams(spec clientSpec) (*held, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(spec.RootsPEM) {
		return nil, errors.New("client spec: no root certificate")
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: spec.ServerName, MinVersion: tls.VersionTLS12})
	perConn := max(1, spec.PerConn)
	ctx, cancel := context.WithCancel(context.Background())
	h := &held{streams: make([]*heldStream, len(spec.Streams))}
	var conns []*grpc.ClientConn
	var wg sync.WaitGroup
	errs := make(chan error, len(spec.Streams))
	sem := make(chan struct{}, 32)
	var cc *grpc.ClientConn
	for i, w := range spec.Streams {
		if i%perConn == 0 {
			var err error
			if cc, err = grpc.NewClient(spec.Addr, grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20))); err != nil {
				cancel()
				return nil, err
			}
			conns = append(conns, cc)
		}
		conn := cc
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			hs, err := openStream(ctx, conn, w)
			if err != nil {
				errs <- fmt.Errorf("stream of %s: %w", w.NodeID, err)
				return
			}
			hs.h = h
			go hs.read()
			h.streams[i] = hs
		})
	}
	wg.Wait()
	close(errs)
	h.close = func() {
		cancel()
		for _, c := range conns {
			_ = c.Close()
		}
	}
	if err := <-errs; err != nil {
		h.close()
		return nil, err
	}
	return h, nil
}

// openStream opens w's stream and subscribes to CDS, then LDS, ACKing each.
func openStream(ctx context.Context, conn *grpc.ClientConn, w streamClient) (*heldStream, error) {
	sctx := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+w.Token)
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	for k, t := range []string{resource.ClusterType, resource.ListenerType} {
		if err != nil {
			break
		}
		req := &discovery.DiscoveryRequest{TypeUrl: t}
		if k == 0 {
			req.Node = sidecarNode(w.NodeID)
		}
		if err = st.Send(req); err != nil {
			break
		}
		var resp *discovery.DiscoveryResponse
		if resp, err = recvType(st, t); err != nil {
			break
		}
		err = st.Send(&discovery.DiscoveryRequest{TypeUrl: t, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()})
	}
	if err != nil {
		return nil, err
	}
	return &heldStream{st: st, routes: make(chan *discovery.DiscoveryResponse, 1), failed: make(chan error, 1)}, nil
}

// recvType reads until a response of typeURL (istiod may push other types
// of the stream's subscriptions meanwhile).
func recvType(st discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, typeURL string) (*discovery.DiscoveryResponse, error) {
	for {
		resp, err := st.Recv()
		if err != nil {
			return nil, err
		}
		if resp.GetTypeUrl() == typeURL {
			return resp, nil
		}
		// ACK the push so the stream stays in sync.
		if err := st.Send(&discovery.DiscoveryRequest{TypeUrl: resp.GetTypeUrl(), VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			return nil, err
		}
	}
}

// latencies subscribes every held stream to RDS 9080, 16 at a time, and
// returns the time to each answer, sorted.
func latencies(h *held) ([]time.Duration, error) {
	out := make([]time.Duration, len(h.streams))
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(h.streams); i = int(next.Add(1)) - 1 {
				hs := h.streams[i]
				t0 := time.Now()
				if err := hs.send(&discovery.DiscoveryRequest{TypeUrl: resource.RouteType, ResourceNames: []string{"9080"}}); err != nil {
					errs <- err
					return
				}
				select {
				case <-hs.routes:
				case err := <-hs.failed:
					errs <- err
					return
				}
				out[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}
