"""Kernel builds survive being killed at any point: the next load builds or loads the module
in its normal time, never waits on a dead builder's lock, and a live builder is waited for with
a message naming it. A one-function C source stands in for the 97-second kernel build; a
compiler wrapper (CXX) parks the build at the point the test kills it."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

BUILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tacit.kernels.jit_build import build_extension
    m = build_extension("standin", Path(sys.argv[1]), ["standin.cpp"], ["-O0"], [], ["-O0"],
                        "compiling the stand-in", "stand-in unavailable")
    print("answer", m.answer() if m is not None else None, flush=True)
    """
)
STANDIN = textwrap.dedent(
    """
    #include <Python.h>
    #define PASTE(a, b) a##b
    #define INIT(n) PASTE(PyInit_, n)
    #define STR2(x) #x
    #define STR(x) STR2(x)
    static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(42); }
    static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};
    PyMODINIT_FUNC INIT(TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&def); }
    """
)
# Parks the build where PHASE says: "probe" (torch asking the compiler its version, before any
# source is compiled), "compile" (a -c), "link"; touches MARK when it gets there and stays parked
# while MARK exists (the fixture removes it after the test). ninja runs each compiler under a
# `sh -c` in a process group of its own, so killing the builder's group leaves the parked
# compiler behind: a plain `sleep 600` outlived every test run by ten minutes.
WRAPPER = textwrap.dedent(
    """\
    #!/bin/sh
    case " $* " in
      *" -c "*) phase=compile ;;
      *" -shared "*) phase=link ;;
      *) phase=probe ;;
    esac
    if [ "$phase" = "$TACIT_TEST_PARK_AT" ]; then
      touch "$TACIT_TEST_MARK"
      while [ -e "$TACIT_TEST_MARK" ]; do sleep 0.1; done
      exit 1
    fi
    exec c++ "$@"
    """
)


@pytest.fixture
def standin(tmp_path):
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "standin.cpp").write_text(STANDIN)
    wrapper = tmp_path / "cxx"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    env = dict(os.environ, TACIT_CACHE_DIR=str(tmp_path / "cache"))
    yield csrc, wrapper, env, tmp_path
    for mark in tmp_path.glob("parked-at-*"):
        mark.unlink()  # lets a parked compiler go


def start_build(csrc, env, **extra):
    return subprocess.Popen(
        [sys.executable, "-c", BUILD, str(csrc)],
        env=dict(env, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: killed whole, compiler included
    )


def park(csrc, wrapper, env, tmp_path, phase):
    mark = tmp_path / f"parked-at-{phase}"
    proc = start_build(csrc, env, CXX=str(wrapper), TACIT_TEST_PARK_AT=phase, TACIT_TEST_MARK=str(mark))
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"the build never reached {phase}"
        time.sleep(0.05)
    return proc


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out, err


@pytest.mark.parametrize("phase", ["probe", "compile", "link"])
def test_a_build_killed_at_any_point_does_not_block_the_next(standin, phase):
    csrc, wrapper, env, tmp_path = standin
    parked = park(csrc, wrapper, env, tmp_path, phase)
    os.killpg(parked.pid, signal.SIGKILL)
    parked.wait()
    start = time.monotonic()
    out, err = finish(start_build(csrc, env), timeout=120)
    assert "answer 42" in out
    assert "waiting for" not in err  # the dead builder's lock went with it
    assert time.monotonic() - start < 60, err
    # Nothing of the killed build is left: one module file, no private build directories.
    (home,) = (tmp_path / "cache" / "kernels").glob("torch-*/standin_*")
    assert sorted(p.name for p in home.iterdir() if p.is_dir()) == []
    assert len(list(home.glob("*.so"))) == 1


def test_a_built_module_loads_without_a_compiler(standin):
    csrc, wrapper, env, _ = standin
    out, err = finish(start_build(csrc, env))
    assert "answer 42" in out and "compiling the stand-in ..." in err
    out, err = finish(start_build(csrc, env, CXX="/bin/false", PATH="/nonexistent"))
    assert "answer 42" in out and "compiling" not in err


def test_a_live_builder_is_waited_for_by_name(standin):
    csrc, wrapper, env, tmp_path = standin
    parked = park(csrc, wrapper, env, tmp_path, "compile")
    waiter = start_build(csrc, env)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "waiting for" not in line:  # said at once, not after the wait
            assert time.monotonic() < deadline and waiter.poll() is None
            line = waiter.stderr.readline()
        assert f"waiting for process {parked.pid} to finish compiling the stand-in" in line
    finally:
        os.killpg(parked.pid, signal.SIGKILL)
        parked.wait()
    out, err = finish(waiter)
    assert "answer 42" in out


def test_build_kernels_leaves_every_usable_kernel_built(tmp_path):
    """`tacit build-kernels` (what setup runs): every kernel this host can use is in the cache
    afterwards, so a following engine load compiles nothing."""
    from tacit.distributed.shm_kernels import load_shm_kernels
    from tacit.kernels.cpu_kernels import cpu_supports_avx512_bf16, load_cpu_kernels

    r = subprocess.run(
        [sys.executable, "-m", "tacit.cli", "build-kernels"], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for supported, load in [(cpu_supports_avx512_bf16(), load_cpu_kernels), (True, load_shm_kernels)]:
        if supported:
            module = load()
            assert module is not None and module.__file__ in r.stdout
    code = "from tacit import LLM; import sys; LLM(sys.argv[1]).generate([[1, 2, 3]])"
    from tiny_models import build_hf_model

    build_hf_model("llama", tmp_path / "m")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "compiling" not in r.stderr
