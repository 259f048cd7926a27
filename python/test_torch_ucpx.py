"""Two-process PyTorch check of python/ucpx.py on a GPU (issue 19, item 4).

    UCPX_LIB=bin/libucpx.so python3 python/test_torch_ucpx.py

starts two ranks (this script with --rank 0/1) that wire up by worker address strings
(files in a temporary directory) and exchange a CUDA tensor for every size from 4 B to
64 MiB, in stream order on torch's current stream (a non-default stream: the legacy
default stream has no handle to adopt):

  rank 1 enqueues tag_recv(tensor.data_ptr()) with a condition on
         torch.cuda.current_stream().cuda_stream, records a torch event right after
         (Request.record_event, or Condition.record_event for one size) and tells rank 0,
         over a host message, that it is posted;
  rank 0 waits 200 ms (the peer is late), then fills its tensor on its current stream
         and enqueues tag_send on it;
  rank 1 checks that the event is not ready while rank 0 is late (the MPICH #7612
         pattern: the event is recorded after the enqueue and must not complete before
         the data is there), then makes a second torch stream wait on the event and
         compares the tensor with the expected one there (torch.equal).

Exit status 0 and "OK torch rank N" from both ranks on success. Without PyTorch or CUDA
it prints SKIP and exits 0, unless UCPX_REQUIRE_GPU=1 (then 1).
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time

SIZES = [4, 64, 4096, 65536, 1 << 20, 16 << 20, 64 << 20]
LATE = 0.2  # seconds rank 0 waits before sending


def skip(msg):
    if os.environ.get("UCPX_REQUIRE_GPU") == "1":
        print(f"FAIL: {msg} (UCPX_REQUIRE_GPU=1)")
        sys.exit(1)
    print(f"SKIP: {msg}")
    sys.exit(0)


def parent():
    try:
        import torch
    except ImportError:
        skip("no PyTorch")
    if not torch.cuda.is_available():
        skip("no CUDA device")
    with tempfile.TemporaryDirectory() as wire:
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--rank", str(r), "--dir", wire],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
        ok = True
        for r, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=600)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                print(f"rank {r}: timed out")
            text = out.decode(errors="replace")
            print(f"--- rank {r} (exit {p.returncode}) ---\n{text}", end="")
            ok = ok and p.returncode == 0 and f"OK torch rank {r}" in text
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


def publish(wire, rank, name, value):
    tmp = os.path.join(wire, f".{name}.{rank}")
    with open(tmp, "w") as f:
        f.write(value)
    os.rename(tmp, os.path.join(wire, f"{name}.{rank}"))


def fetch(wire, rank, name):
    path = os.path.join(wire, f"{name}.{1 - rank}")
    for _ in range(6000):
        if os.path.exists(path):
            with open(path) as f:
                return f.read()
        time.sleep(0.01)
    raise RuntimeError(f"no {name} from the peer")


def expected(torch, n, device):
    return ((torch.arange(n, device=device, dtype=torch.int64) * 7 + n) % 251).to(torch.uint8)


def event_handle(ev):
    h = getattr(ev, "cuda_event", None)
    if h is None:
        h = ev._as_parameter_.value
    return int(h)


def rank_main(rank, wire):
    # libucpx.so first: a Go shared library needs a little static TLS, which a process
    # that has loaded PyTorch's many libraries may have used up for late dlopens.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ucpx
    import torch

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    main = torch.cuda.Stream(device=dev)
    torch.cuda.set_stream(main)
    assert torch.cuda.current_stream().cuda_stream != 0

    ctx = ucpx.Context()
    w = ctx.worker()
    publish(wire, rank, "addr", w.address())
    ep = w.connect(fetch(wire, rank, "addr"))
    cond = ucpx.CudaCondition(torch.cuda.current_stream().cuda_stream)
    note = (ctypes.c_ubyte * 8)()
    note_addr = ctypes.addressof(note)
    other = torch.cuda.Stream(device=dev)

    for i, n in enumerate(SIZES):
        tag = 0x1900 + i
        t0 = time.time()
        if rank == 0:
            w.tag_recv_wait(note_addr, 8, 0x100 + i, timeout=120)  # rank 1 posted
            time.sleep(LATE)
            t = expected(torch, n, dev)  # on the current stream, before the send in stream order
            req = ep.tag_send(t.data_ptr(), n, tag, mem_type=ucpx.MEMORY_CUDA, condition=cond)
            req.wait(timeout=120)
            req.close()
            torch.cuda.current_stream().synchronize()
            print(f"size {n}: sent in {time.time() - t0:.3f}s", flush=True)
        else:
            r = torch.zeros(n, dtype=torch.uint8, device=dev)
            req = w.tag_recv(r.data_ptr(), n, tag, mem_type=ucpx.MEMORY_CUDA, condition=cond)
            ev = torch.cuda.Event()
            ev.record()  # torch creates the CUevent on its first record
            if i == 3:
                cond.record_event(event_handle(ev))
            else:
                req.record_event(event_handle(ev))
            ep.tag_send_wait(note_addr, 8, 0x100 + i, timeout=120)
            assert not ev.query(), f"size {n}: the event recorded after the enqueue is ready at once"
            time.sleep(LATE / 2)
            assert not ev.query(), f"size {n}: the event is ready while the peer is still late"
            other.wait_event(ev)
            with torch.cuda.stream(other):
                want = expected(torch, n, dev)
                same = torch.equal(r, want)
            assert same, f"size {n}: the tensor differs from the sent one"
            req.wait(timeout=120)
            got, stag = req.info()
            assert (got, stag) == (n, tag), (got, stag)
            req.close()
            assert ev.query()
            print(f"size {n}: received and checked in {time.time() - t0:.3f}s", flush=True)

    # Neither side closes before the other is done.
    if rank == 0:
        ep.tag_send_wait(note_addr, 8, 0x999, timeout=120)
    else:
        w.tag_recv_wait(note_addr, 8, 0x999, timeout=120)
    torch.cuda.synchronize()
    cond.close()
    ep.close()
    w.close()
    ctx.close()
    print(f"OK torch rank {rank}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int)
    ap.add_argument("--dir")
    a = ap.parse_args()
    if a.rank is None:
        parent()
    else:
        rank_main(a.rank, a.dir)
