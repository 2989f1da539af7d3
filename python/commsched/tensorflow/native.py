"""The native TensorFlow ops (plugins/tensorflow/commsched_tf_ops.cc): found prebuilt beside this package, or compiled
once per TensorFlow version and source into ~/.cache/commsched/tf-ops with the installed TensorFlow's own flags
(tf.sysconfig), then loaded with tf.load_op_library.

load() returns the op module, or None with a warning that says why (no C++ compiler, a failed compile): the
operations then run as host callbacks (tf.numpy_function), which give the same results.
"""
import ctypes
import fcntl
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import warnings

import tensorflow as tf

from commsched import _C

SOURCE_NAME = "commsched_tf_ops.cc"
_HERE = pathlib.Path(__file__).resolve().parent
_state = {}  # "module" (None: not available), "library" (ctypes handle)


def _source():
    """The op source: copied beside this module by the build and by pip; in a source checkout, plugins/tensorflow."""
    for candidate in (_HERE / SOURCE_NAME, _HERE.parents[2] / "plugins" / "tensorflow" / SOURCE_NAME):
        if candidate.exists():
            return candidate
    return None


def _compiler():
    chosen = os.environ.get("CXX")
    return shutil.which(chosen) if chosen else shutil.which("c++") or shutil.which("g++")


def _cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "commsched" / "tf-ops"


def _build(source, compiler):
    """Compiles the op library unless the cache has it; one process compiles while the others wait on a lock."""
    flags = tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags()
    key = hashlib.sha256((source.read_text() + tf.__version__ + " ".join(flags) + compiler).encode()).hexdigest()[:16]
    out_dir = _cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"commsched_tf_ops-{tf.__version__}-{key}.so"
    with open(out_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        print(f"commsched: compiling the TensorFlow ops for TensorFlow {tf.__version__} (once; cached in {out_dir})",
              file=sys.stderr, flush=True)
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        # TensorFlow's own headers use its deprecated names; their warnings say nothing about this source.
        cmd = [compiler, "-shared", "-fPIC", "-O2", "-Wno-deprecated-declarations", str(source), "-o",
               str(partial)] + flags
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            partial.unlink(missing_ok=True)
            raise RuntimeError(f"compiling {source.name} failed ({' '.join(cmd)}):\n{run.stderr[-4000:]}")
        partial.rename(target)
    return target


def _compiled_here():
    source = _source()
    if source is None:
        raise RuntimeError(f"{SOURCE_NAME} is not installed beside {_HERE}")
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError(f"no C++ compiler was found ({'CXX=' + os.environ['CXX'] if os.environ.get('CXX') else 'c++, g++'}"
                           f"; install g++, or set CXX) to build them against TensorFlow {tf.__version__}")
    return _build(source, compiler)


def _open(path):
    _state["module"] = tf.load_op_library(str(path))
    _state["library"] = ctypes.CDLL(str(path))


def load():
    """The op module (CommschedSubmit, CommschedWait), or None where they cannot be built (warned once). A library
    built with the package serves when it loads into this TensorFlow; otherwise one is compiled for it."""
    if "module" in _state:
        return _state["module"]
    prebuilt = _HERE / "commsched_tf_ops.so"
    try:
        _open(prebuilt)
        return _state["module"]
    except Exception:  # noqa: BLE001 -- absent, or built for another TensorFlow: compile one for this TensorFlow
        pass
    try:
        _open(_compiled_here())
    except Exception as e:  # noqa: BLE001 -- any reason means falling back, said once
        _state["module"] = None
        warnings.warn(f"commsched: the native TensorFlow ops are not available ({e}); the operations run as host "
                      "callbacks (tf.numpy_function) instead (the same results)")
    return _state["module"]


def _bind(submit, context):
    lib = _state["library"]
    lib.commsched_tf_bind.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.commsched_tf_bind(ctypes.c_void_p(submit), ctypes.c_void_p(context))


def bind(ctx):
    """Points the ops at this Context (loading or building them first)."""
    if load() is not None:
        _bind(_C.c_submit_address(), ctx.address)


def unbind():
    """The ops let go of the Context (a kernel run afterwards fails saying init() was not called)."""
    if _state.get("module") is not None:
        _bind(0, 0)
