package ucp_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ucpx/ucpx/ucp"
)

// Two contexts holding the same auth key connect through an authenticated listener; a
// context with another key is refused before anything reaches UCX.
func ExampleContextParams_authKey() {
	key, _ := ucp.GenerateAuthKey() // every process of a job: ucpx keygen, UCPX_AUTH_KEY_FILE
	server, _ := ucp.NewContext(ucp.ContextParams{AuthKey: key, Config: map[string]string{"TLS": "tcp"}})
	defer server.Close()
	client, _ := ucp.NewContext(ucp.ContextParams{AuthKey: key, Config: map[string]string{"TLS": "tcp"}})
	defer client.Close()
	sw, _ := server.NewWorker(ucp.WorkerParams{ProgressThread: true})
	cw, _ := client.NewWorker(ucp.WorkerParams{})
	l, _ := sw.Listen("127.0.0.1:0", &ucp.ListenerParams{ConnHandler: func(r *ucp.ConnRequest) { _, _ = r.Accept(nil) }})
	defer l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := cw.Connect(ctx, l.Addr(), nil)
	fmt.Println("same key:", err)

	other, _ := ucp.GenerateAuthKey()
	stranger, _ := ucp.NewContext(ucp.ContextParams{AuthKey: other, Config: map[string]string{"TLS": "tcp"}})
	defer stranger.Close()
	xw, _ := stranger.NewWorker(ucp.WorkerParams{})
	_, err = xw.Connect(ctx, l.Addr(), nil)
	fmt.Println("other key refused:", errors.Is(err, ucp.ErrAuth))
	// Output:
	// same key: <nil>
	// other key refused: true
}
