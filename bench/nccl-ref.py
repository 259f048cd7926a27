"""NCCL reference numbers for two processes on two GPUs (issue 15), through PyTorch.

    NCCL_NVLS_ENABLE=0 python3 bench/nccl-ref.py [--quick]

Starts two ranks (this script with --rank 0/1, rank r on GPU r) that join a
torch.distributed NCCL group through a file in a temporary directory, and prints, from
rank 0 and in the same units as the ucpx benchmarks it is compared with:

  sendrecv  N  GB/s     rank 0 sends N bytes to rank 1 (dist.send / dist.recv),
                        4 MiB to 1 GiB: BenchmarkGPUIPCPut's ipc_GB/s
  pingpong  8  us       8 bytes back and forth, half round trip, eager (and captured
                        in a CUDA graph): BenchmarkGPUIPCPingPong's ipc_half_rt_us
  allgather N  GB/s     all_gather_into_tensor of N output bytes, algbw = N / time,
                        1 MiB to 256 MiB: BenchmarkGPUIPCAllgather2's algbw

Every transfer's data is checked once per size (the received tensor against the
sender's fill). Exit status 0 on success; without PyTorch or two GPUs it prints SKIP
and exits 0, unless UCPX_REQUIRE_GPU=1 (then 1).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20


def skip(msg):
    if os.environ.get("UCPX_REQUIRE_GPU") == "1":
        print(f"FAIL: {msg} (UCPX_REQUIRE_GPU=1)")
        sys.exit(1)
    print(f"SKIP: {msg}")
    sys.exit(0)


def timed(torch, fn, reps):
    """Seconds per call of fn over reps calls, after two warm calls."""
    fn()
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def rank_main(rank, init_file, quick):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2)
    peer = 1 - rank
    out = []

    def say(line):
        if rank == 0:
            out.append(line)
            print(line, flush=True)

    # send/recv bandwidth, rank 0 -> rank 1
    sizes = [4 * MiB, 64 * MiB, 256 * MiB] + ([] if quick else [1024 * MiB])
    for n in sizes:
        t = torch.full((n,), 0x5A if rank == 0 else 0, dtype=torch.uint8, device=dev)
        reps = max(4, min(200, (2 << 30) // n))

        def step():
            if rank == 0:
                dist.send(t, dst=peer)
            else:
                dist.recv(t, src=peer)

        dist.barrier()
        sec = timed(torch, step, reps)
        if rank == 1 and not bool((t == 0x5A).all()):
            raise SystemExit(f"sendrecv {n}: wrong data on rank 1")
        say(f"nccl sendrecv {n // MiB:5d} MiB {n / sec / 1e9:9.1f} GB/s")
        del t

    # 8-byte ping-pong, half round trip
    iters = 500 if quick else 3000
    t = torch.zeros(2, dtype=torch.int32, device=dev)

    def pingpong():
        if rank == 0:
            dist.send(t, dst=peer)
            dist.recv(t, src=peer)
        else:
            dist.recv(t, src=peer)
            dist.send(t, dst=peer)

    dist.barrier()
    sec = timed(torch, pingpong, iters)
    say(f"nccl pingpong     8 B {sec / 2 * 1e6:9.2f} us half round trip (eager)")

    # all_gather_into_tensor, output sizes
    n = MiB
    while n <= 256 * MiB:
        half = n // 2
        inp = torch.full((half,), 0x11 * (rank + 1), dtype=torch.uint8, device=dev)
        outp = torch.zeros(n, dtype=torch.uint8, device=dev)
        reps = max(10, min(1000, (4 << 30) // n))
        dist.barrier()
        sec = timed(torch, lambda: dist.all_gather_into_tensor(outp, inp), reps)
        want = torch.cat([torch.full((half,), 0x11 * (r + 1), dtype=torch.uint8, device=dev) for r in range(2)])
        if not torch.equal(outp, want):
            raise SystemExit(f"allgather {n}: wrong data on rank {rank}")
        say(f"nccl allgather {n // MiB:4d} MiB {sec * 1e6:10.2f} us  algbw {n / sec / 1e9:7.1f} GB/s")
        n *= 4

    # the ping-pong inside a CUDA graph (last: a capture that fails must not cost the
    # rows above): one launch is 100 round trips
    try:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            pingpong()  # the communicator on this stream
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                for _ in range(100):
                    pingpong()
        dist.barrier()
        sec = timed(torch, g.replay, 5 if quick else 30)
        say(f"nccl pingpong     8 B {sec / 100 / 2 * 1e6:9.2f} us half round trip (CUDA graph)")
    except Exception as e:  # report, do not hide: the eager rows stand
        say(f"nccl pingpong in a CUDA graph: not measured: {e}")
    torch.cuda.synchronize()
    if rank == 0:
        print("OK nccl-ref", flush=True)
    # No barrier or destroy_process_group after the captured exchanges: with the graph
    # still holding the communicator, both hung in torch 2.x on the device machine.
    sys.stdout.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int)
    ap.add_argument("--init")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if a.rank is not None:
        rank_main(a.rank, a.init, a.quick)
        return
    try:
        import torch
    except ImportError:
        skip("no PyTorch")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        skip("fewer than two CUDA devices")
    with tempfile.TemporaryDirectory() as d:
        init = os.path.join(d, "init")
        args = [sys.executable, os.path.abspath(__file__), "--init", init] + (["--quick"] if a.quick else [])
        procs = [subprocess.Popen(args + ["--rank", str(r)]) for r in range(2)]
        deadline = time.monotonic() + float(os.environ.get("NCCL_REF_TIMEOUT", "240"))
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                print("FAIL: timed out")
                sys.exit(1)
    if any(codes):
        print(f"FAIL: rank exit codes {codes}")
        sys.exit(1)


if __name__ == "__main__":
    main()
