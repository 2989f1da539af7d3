"""Horovod's build queries, answered truthfully for every framework plugin: commsched has no MPI, DDL, oneCCL or
ROCm; Gloo, CUDA and NCCL as this build carries them. gloo_enabled (what this process's backend uses) needs the
plugin's own context, so each plugin defines it with backend_is()."""
from commsched import _C


def mpi_built():
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built():
    return bool(_C.build["gloo"])


def nccl_built():
    return bool(_C.build["nccl"])


def cuda_built():
    return bool(_C.build["cuda"])


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


def backend_is(name, is_initialized, context):
    """Whether the plugin's Context (when initialised) runs on backend `name`."""
    return is_initialized() and context().backend == name
