// Package bootstrap lets the N processes of a job find each other, the way torchrun
// (RANK, WORLD_SIZE, MASTER_ADDR), PMIx or NCCL's unique-id broadcast do.
//
// Each rank calls FromEnv (UCPX_RANK, UCPX_SIZE, UCPX_RENDEZVOUS=host:port, set by
// `ucpx launch -n N -- cmd` on one host, or by the user's scheduler across hosts) or
// New. Rank 0 serves the rendezvous on that address; every rank connects to it,
// authenticates with the job's pre-shared key (Options.Key or the file named by
// UCPX_AUTH_KEY_FILE: a mutual HMAC-SHA256 challenge-response, so neither side sends
// anything the other could use before both proved they hold the key; the key proves
// who connected, while the frames after the handshake travel unencrypted and without a
// MAC, as TCPStore's do: run the rendezvous on a network you trust), publishes its
// ucp worker address in the rendezvous's key-value store and waits in a barrier until
// all N have joined.
//
// No endpoint is made at start: Job.Endpoint(r) connects to rank r the first time it
// is asked, so a rank pays only for the peers it talks to (a ring of 1024 ranks opens
// 2 endpoints per rank, not 1023). The Store (Set, Get, Wait) and Job.Barrier are
// there for the user's own exchange (rkeys, sizes), as torch's TCPStore is.
//
// Failure: endpoints use UCX's peer error handling, so a rank's death fails every
// operation pending on it (ucp.ErrPeerFailed) and releases the streams waiting on
// them; Job.Failed and Options.OnFailure name the rank, as does a RankError
// (ErrRankFailed, which matches ucp.ErrPeerFailed) from a barrier. The rendezvous also
// sees a rank's connection drop without a goodbye (TCP keepalive notices a silent host
// in about 4 s) and tells every rank. OnFailure runs on a goroutine of the job's, one
// failure at a time and in order, so it may use the Store and Barrier. A rank that
// leaves on purpose (Job.Close) has not failed, but no barrier can complete without
// it: pending and later barriers fail at once with a RankError naming it that matches
// ErrClosed (and ErrRankFailed). A failed job is not repaired: survivors and the
// restarted rank form a new job (a new rendezvous), as torchrun's elastic agents do.
// Endpoints made with EndpointParams.NoPeerErrorHandling (shared memory in UCX 1.13)
// give up that detection (ucp still watches a peer process of the same host), and UCX
// cannot force-close them: on a caller's Worker, Job.Close flushes them within 5 s,
// closes them regardless, and names the ranks whose flush did not finish (a rank that
// stopped progressing or died unseen) in an error matching ErrTimedOut.
//
// Waits: a wait that its context ends fails with ErrTimedOut and
// context.DeadlineExceeded (a deadline) or ErrCanceled and context.Canceled (a
// cancel). A Store.Wait so abandoned is withdrawn from the rendezvous; a Barrier so
// abandoned has still arrived, and the job's next Barrier call resumes it: either may
// be retried with short deadlines. New gives up when its context ends (rank 0 stops
// serving at once).
//
// The rendezvous protocol is length-prefixed frames whose every length is bounded
// (MaxKey, MaxValue, MaxFrame) before anything is allocated; bytes that are not the
// protocol close that connection with ErrProtocol and disturb no other rank. The
// rendezvous answers each connection through its own bounded queue: a rank that stops
// reading stalls nobody else, its requests are no longer read, and it is cut off (as
// failed) when nothing could be written to it for 10 s, or its queue's own memory
// overflows (answers share a stored value: a Set answering many of a rank's Waits
// does not copy it for each). Past 64 connections that have not joined yet, a new one
// takes the slot of the oldest still silent in its handshake after 1 s, or is closed at
// once; one past its handshake keeps its slot until its hello (20 s at most). A joining
// rank whose connection the rendezvous closed before it joined tries again until its
// context ends, so any number of ranks may start together, also on slow paths.
package bootstrap
