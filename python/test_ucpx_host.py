"""Host-memory check of python/ucpx.py (no GPU, no PyTorch): two workers of one
process exchange tag messages and do RMA through libucpx.so. tests/capi_test.go runs
it where python3 exists (UCPX_LIB names the library); prints "OK python".
"""
import ctypes
import gc
import os
import sys

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
        rkey.close()
        mem.close()
        ab.close()
        ba.close()
        a.close()
        b.close()
    print("OK python")


if __name__ == "__main__":
    main()
