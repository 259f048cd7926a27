"""Host-memory check of python/ucpx.py (no GPU, no PyTorch): two workers of one
process exchange tag messages and do RMA through libucpx.so. tests/capi_test.go runs
it where python3 exists (UCPX_LIB names the library); prints "OK python".
"""
import ctypes
import gc
import os
import sys
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ucpx  # noqa: E402


def addr(buf):
    return ctypes.addressof(buf)


def check_connections_default():
    """import ucpx gives CUDA 32 hardware queues unless the environment set a number."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    probe = "import os, ucpx; print(os.environ['CUDA_DEVICE_MAX_CONNECTIONS'])"
    for given, want in ((None, "32"), ("", "32"), ("4", "4")):
        env = dict(os.environ, PYTHONPATH=here)
        env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        if given is not None:
            env["CUDA_DEVICE_MAX_CONNECTIONS"] = given
        got = subprocess.run([sys.executable, "-c", probe], env=env, check=True,
                             capture_output=True, text=True).stdout.strip()
        assert got == want, f"CUDA_DEVICE_MAX_CONNECTIONS={given!r}: {got!r}, want {want!r}"


class Buf(bytearray):
    """A bytearray that takes weak references (bytearray itself does not)."""


def check_dropped_receives(a, b, ab):
    msg = (ctypes.c_ubyte * 8)(*b"dropped!")
    got = (ctypes.c_ubyte * 8)()
    # A receive dropped while pending is canceled: before, __del__ freed its handle
    # with the receive still posted, and it took the next message of its tag (into
    # memory that may be gone by then), so the receive below never got it.
    tmp = (ctypes.c_ubyte * 8)()
    r = b.tag_recv(addr(tmp), 8, tag=5)
    del r
    gc.collect()
    ab.tag_send_wait(addr(msg), 8, tag=5, timeout=30)
    assert b.tag_recv_wait(addr(got), 8, tag=5, timeout=10) == (8, 5), "the dropped receive took the message"
    assert bytes(got) == b"dropped!" and bytes(tmp) == bytes(8)
    # A buffer object given instead of an address lives as long as the operation.
    buf = Buf(8)
    ref = weakref.ref(buf)
    r = b.tag_recv(buf, 8, tag=6)
    del buf
    gc.collect()
    assert ref() is not None, "a pending receive's buffer was collected"
    ab.tag_send_wait(addr(msg), 8, tag=6, timeout=30)
    r.wait(30)
    assert r.info() == (8, 6) and bytes(ref()) == b"dropped!"
    r.close()
    gc.collect()
    assert ref() is None, "a completed receive's buffer is still held"
    # ... and a pending receive into one, dropped at once, is canceled and lets it go.
    buf = Buf(8)
    ref = weakref.ref(buf)
    b.tag_recv(buf, 8, tag=7)
    del buf
    gc.collect()
    assert ref() is None, "a dropped receive's buffer is still held"
    ab.tag_send_wait(addr(msg), 8, tag=7, timeout=30)
    assert b.tag_recv_wait(addr(got), 8, tag=7, timeout=10) == (8, 7)
    # A buffer object shorter than nbytes is refused.
    try:
        b.tag_recv(Buf(8), 9, tag=8)
        raise AssertionError("nbytes past the buffer was accepted")
    except ValueError:
        pass


def check_ranges(ctx, a, b, ab, rkey, base, region):
    """Integers out of their C type's range raise ValueError: before, ctypes wrapped
    them (tag 2**64+7 went out as 7, nbytes 2**64+4 as 4, partitions 2**32+2 as 2)."""
    src = (ctypes.c_ubyte * 64)()
    calls = {
        "tag": lambda: ab.tag_send(addr(src), 8, tag=2**64 + 7),
        "blocking tag": lambda: ab.tag_send_wait(addr(src), 8, tag=2**64 + 7, timeout=1),
        "nbytes": lambda: ab.tag_send(addr(src), 2**64 + 4, tag=1),
        "negative nbytes": lambda: ab.tag_send(addr(src), -1, tag=1),
        "address": lambda: ab.tag_send(2**64 + addr(src), 8, tag=1),
        "mask": lambda: b.tag_recv(addr(src), 8, tag=1, mask=-1),
        "receive mem_type": lambda: b.tag_recv(addr(src), 8, tag=1, mem_type=2**32),
        "blocking receive tag": lambda: b.tag_recv_wait(addr(src), 8, tag=2**64 + 1, timeout=1),
        "mem_map mem_type": lambda: ctx.mem_map(addr(region), 64, mem_type=2**32),
        "mem_map nbytes": lambda: ctx.mem_map(addr(region), 2**64 + 64),
        "raddr": lambda: ab.put(addr(src), 8, base + 2**64, rkey),
        "flags": lambda: ab.get(addr(src), 8, base, rkey, flags=2**32),
        "partitions": lambda: ucpx.Partitioned(True, a, ab, addr(src), 64, 2**32 + 2, 9),
        "partition tag": lambda: ucpx.Partitioned(False, b, ab, addr(src), 64, 2, 2**64 + 9),
    }
    for what, call in calls.items():
        try:
            call()
            raise AssertionError(f"{what} out of range was accepted")
        except ValueError:
            pass


def main():
    check_connections_default()
    with ucpx.Context() as ctx:
        a, b = ctx.worker(), ctx.worker()
        ab, ba = a.connect(b.address()), b.connect(a.address())
        for n in (1, 8, 4096, 1 << 20):
            src = (ctypes.c_ubyte * n)(*[(i * 7 + n) & 0xFF for i in range(n)])
            dst = (ctypes.c_ubyte * n)()
            r = b.tag_recv(addr(dst), n, tag=n)
            s = ab.tag_send(addr(src), n, tag=n)
            # One thread drives both workers (a large message needs both to progress).
            while not (s.test() & r.test()):
                pass
            s.close()
            assert r.info() == (n, n), r.info()
            assert bytes(dst) == bytes(src), f"size {n}: payload differs"
            r.close()
        # RMA: b exposes a region, a puts into it and gets it back.
        n = 65536
        region = (ctypes.c_ubyte * n)()
        mem = ctx.mem_map(addr(region), n)
        rkey = ab.unpack_rkey(mem.pack_rkey())
        base, length = rkey.region()
        assert (base, length) == (addr(region), n), (base, length)
        src = (ctypes.c_ubyte * 1024)(*[(i * 3) & 0xFF for i in range(1024)])
        ab.put(addr(src), 1024, base + 512, rkey).wait(30)
        flush = ab.flush()
        while not flush.test():
            b.progress()
        assert bytes(region[512:1536]) == bytes(src), "put payload differs"
        back = (ctypes.c_ubyte * 1024)()
        g = ab.get(addr(back), 1024, base + 512, rkey)
        while not g.test():
            b.progress()
        assert bytes(back) == bytes(src), "get payload differs"
        try:
            ab.put(addr(src), 1024, base + n - 8, rkey)
            raise AssertionError("a put past the region was accepted")
        except ucpx.Error as e:
            assert e.code == ucpx.ERR_OUT_OF_RANGE, e
        try:
            a.connect("zz")
            raise AssertionError("a bad address was accepted")
        except ucpx.Error as e:
            assert e.code == ucpx.ERR_INVALID_ADDR and "address" in str(e), e
        # A timeout a C int cannot hold is refused, not wrapped into a short (or an
        # endless) one.
        for bad in (4294967.297, -1):
            try:
                b.tag_recv_wait(addr(back), 8, tag=0x99, timeout=bad)
                raise AssertionError(f"timeout {bad} was accepted")
            except ValueError:
                pass
        # A request dropped without close frees its handle (its send still completes).
        s = ab.tag_send(addr(src), 8, tag=0x98)
        h = s.handle
        del s
        gc.collect()
        done = ctypes.c_int(0)
        assert ucpx._lib.ucpx_request_test(h, ctypes.byref(done)) == ucpx.ERR_INVALID_HANDLE, "the dropped request's handle is still live"
        got = (ctypes.c_ubyte * 8)()
        assert b.tag_recv_wait(addr(got), 8, tag=0x98, timeout=30) == (8, 0x98)
        check_dropped_receives(a, b, ab)
        check_ranges(ctx, a, b, ab, rkey, base, region)
        rkey.close()
        mem.close()
        ab.close()
        ba.close()
        a.close()
        b.close()
    print("OK python")


if __name__ == "__main__":
    main()
