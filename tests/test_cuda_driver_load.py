"""cuda_driver.load_library: the driver library loads on the context thread without stopping the
main thread's imports (ctypes.CDLL would hold the GIL through dlopen).

The library under test is built here: a shared object whose constructor, standing in for libcuda's
load, waits (up to 2 s) for a byte that only the main thread sends. If dlopen kept the GIL, the main
thread could not send it until the constructor had given up. Runs wherever a C compiler exists (CI
has one for the kernel build)."""
import ctypes
import os
import shutil
import subprocess
import select
import threading

import pytest

from reflex.backends import cuda_driver

SRC = r"""
#include <poll.h>
#include <stdlib.h>
#include <unistd.h>
static int loaded, signalled;
__attribute__((constructor)) static void slow_init(void) {
    const char *fd_s = getenv("RX_SLOW_FD"), *entered_s = getenv("RX_ENTERED_FD");
    if (fd_s) {
        if (entered_s) (void)!write(atoi(entered_s), "e", 1);   /* "dlopen is running now" */
        struct pollfd p = {atoi(fd_s), POLLIN, 0};
        char c;
        if (poll(&p, 1, 2000) > 0 && read(p.fd, &c, 1) == 1) signalled = 1;
    }
    loaded = 1;
}
int rx_probe_value(void) { return 41 + loaded; }
int rx_signalled(void) { return signalled; }
"""


@pytest.fixture(scope="module")
def slow_lib(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("slowlib")
    (d / "slow.c").write_text(SRC)
    out = d / "libslow.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(d / "slow.c")], check=True)
    return str(out)


def test_load_library_returns_a_working_handle(slow_lib):
    lib = cuda_driver.load_library(slow_lib)
    assert isinstance(lib, ctypes.CDLL)
    assert lib.rx_probe_value() == 42          # the constructor ran once, before the call
    again = cuda_driver.load_library(slow_lib)
    assert again.rx_probe_value() == 42


def test_missing_library_raises_oserror():
    with pytest.raises(OSError):
        cuda_driver.load_library("libreflex-no-such-library.so.7")


def test_main_thread_runs_while_a_thread_loads(tmp_path, slow_lib, monkeypatch):
    # a fresh copy: a library already loaded by the test above would not run its constructor again
    path = tmp_path / "libslow2.so"
    shutil.copy(slow_lib, path)
    r, w = os.pipe()
    er, ew = os.pipe()
    monkeypatch.setenv("RX_SLOW_FD", str(r))
    monkeypatch.setenv("RX_ENTERED_FD", str(ew))
    out = []
    th = threading.Thread(target=lambda: out.append(cuda_driver.load_library(str(path))))
    th.start()
    # wait (GIL released) until the constructor runs inside dlopen; sending the byte earlier
    # would let it pass even through a GIL-holding load. Only a main thread that can run
    # during the load gets past this line in time to send it.
    assert select.select([er], [], [], 10)[0], "the library's constructor never ran"
    os.write(w, b"x")
    th.join()
    for fd in (r, w, er, ew):
        os.close(fd)
    assert out[0].rx_probe_value() == 42
    assert out[0].rx_signalled() == 1, "the main thread could not run while the library loaded"
