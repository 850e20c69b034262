"""iopath.share / iopath.attach against what goes wrong around them: a
share that never answers, a socket file removed under the sharer, a
TMPDIR too long for a unix socket."""

import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import iopath
from test_models import write_safetensors

PREFIX = "iopath-share:v1:"


def one_model(path):
    """A one-tensor safetensors file: its path."""
    write_safetensors(path, {"w": ("U8", (16,), bytes(range(16)))})
    return str(path)


def socket_of(handle):
    return handle[len(PREFIX) + 33:]


def test_an_attach_that_gets_no_answer_fails_at_its_timeout_naming_it(tmp_path):
    path = str(tmp_path / "s")
    quiet = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    quiet.bind(path)
    quiet.listen(8)  # never accepts: the connection waits in its queue
    handle = f"{PREFIX}{'ab' * 16}:{path}"
    t = time.monotonic()
    with pytest.raises(ValueError) as e:
        iopath.attach(handle, timeout=0.3)
    assert time.monotonic() - t < 3
    assert "no answer from the share within the attach timeout of 0.3 s" in str(e.value)
    with pytest.raises(ValueError, match=r"timeout=0: give a number of seconds more than 0"):
        iopath.attach(handle, timeout=0.0)
    quiet.close()


def test_close_returns_when_the_socket_file_is_gone(tmp_path):
    tensors = iopath.load_safetensors(one_model(tmp_path / "m.safetensors"))
    share = iopath.share(tensors)
    # A /tmp cleaner removes the socket.
    os.remove(socket_of(share.handle))
    closer = threading.Thread(target=share.close)
    closer.start()
    closer.join(timeout=10)
    assert not closer.is_alive(), "close() hung"


def test_a_sharer_that_exits_without_close_exits(tmp_path):
    model = one_model(tmp_path / "m.safetensors")
    code = textwrap.dedent(f"""
        import os, iopath
        tensors = iopath.load_safetensors({model!r})
        share = iopath.share(tensors)
        os.remove(share.handle[{len(PREFIX) + 33}:])
        print("shared", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "shared\n"


def test_a_tmpdir_too_long_for_a_socket_is_named_with_the_fix(tmp_path):
    model = one_model(tmp_path / "m.safetensors")
    long = tmp_path / ("t" * 110)
    long.mkdir()
    env = dict(os.environ, TMPDIR=str(long))
    env.pop("XDG_RUNTIME_DIR", None)
    code = textwrap.dedent(f"""
        import iopath
        tensors = iopath.load_safetensors({model!r})
        try:
            iopath.share(tensors)
        except Exception as e:
            print(type(e).__name__, e)
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("ValueError cannot share: its socket would be " + str(long)), out
    assert re.search(
        r"past the \d+ bytes a socket path may have here \(107 bytes a unix socket path holds, "
        r"less the name it is set up under\): set TMPDIR to a shorter directory",
        out,
    ), out
    assert os.listdir(long) == [], "the share left its directory behind"
