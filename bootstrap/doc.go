// Package bootstrap lets the N processes of a job find each other, the way torchrun
// (RANK, WORLD_SIZE, MASTER_ADDR), PMIx or NCCL's unique-id broadcast do.
//
// Each rank calls FromEnv (UCPX_RANK, UCPX_SIZE, UCPX_RENDEZVOUS=host:port, set by
// `ucpx launch -n N -- cmd` on one host, or by the user's scheduler across hosts) or
// New. Rank 0 serves the rendezvous on that address; every rank connects to it,
// authenticates with the job's pre-shared key (Options.Key or the file named by
// UCPX_AUTH_KEY_FILE: a mutual HMAC-SHA256 challenge-response, so neither side sends
// anything the other could use before both proved they hold the key), publishes its
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
// (ErrRankFailed) from a barrier. The rendezvous also sees a rank's connection drop
// without a goodbye (TCP keepalive notices a silent host in about 4 s) and tells every
// rank. A failed job is not repaired: survivors and the restarted rank form a new job
// (a new rendezvous), as torchrun's elastic agents do.
//
// The rendezvous protocol is length-prefixed frames whose every length is bounded
// (MaxKey, MaxValue, MaxFrame) before anything is allocated; bytes that are not the
// protocol close that connection with ErrProtocol and disturb no other rank.
package bootstrap
